"""The `kvscope` command line (Typer): the root app, its command groups, and `main()`.

scrape (one /metrics)   targets (target ...)   engine (engine ...)   models (model ...)
probe (probe ..., profile ...)   plan (plan)   simulate (what-if)   export (export ...)
processes (worker, console, up)   hosts (hosts ...: where targets may point)   users (users ...)
audit (audit export)   diagnose (why the tail broke)   _shared (settings, store, logging,
output files).

`main()` is the one error boundary: a `KvscopeError` (bad input, or the world refused)
becomes `error: <one line>` on stderr and exit 2; a usage mistake prints Click's usage
and error lines, exit 2; anything else is a bug: one line, the traceback in a log, exit 1.
Settings are built here, at the entry point, and handed down.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import traceback
from pathlib import Path
from typing import IO, Any, Protocol, cast

import typer

from app.cli.audit import audit_app
from app.cli.diagnose import diagnose as diagnose_command
from app.cli.engine import engine_app
from app.cli.export import export_app
from app.cli.hosts import hosts_app
from app.cli.models import model_app
from app.cli.plan import plan as plan_command
from app.cli.probe import probe_app, profile_app
from app.cli.processes import console, up, worker
from app.cli.scrape import scrape as scrape_command
from app.cli.series import series as series_command
from app.cli.simulate import simulate_app
from app.cli.targets import target_app
from app.cli.users import users_app
from planner.errors import KvscopeError

app = typer.Typer(
    name="kvscope",
    help="Capacity planning and live monitoring for vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(target_app, name="target")
app.add_typer(hosts_app, name="hosts")
app.add_typer(engine_app, name="engine")
app.add_typer(model_app, name="model")
app.add_typer(probe_app, name="probe")
app.add_typer(profile_app, name="profile")
app.add_typer(export_app, name="export")
app.add_typer(users_app, name="users")
app.add_typer(audit_app, name="audit")
app.add_typer(simulate_app, name="simulate")
app.command("plan")(plan_command)
app.command("scrape")(scrape_command)
app.command("diagnose")(diagnose_command)
app.command("series")(series_command)
app.command("worker")(worker)
app.command("console")(console)
app.command("up")(up)

log = logging.getLogger(__name__)

# Typer (0.29 here) raises the exceptions of the Click it vendors (`typer._click`), not
# subclasses of the `click` package's: catching `click.ClickException` let every usage
# error escape as a traceback. The module that defines Typer's public `BadParameter`
# defines their common base, whichever Click that is.
_CLICK_ERROR: type[Exception] = vars(sys.modules[typer.BadParameter.__module__])["ClickException"]


class _ClickError(Protocol):
    """What Click's exceptions offer: their exit code, and a `show` that prints them."""

    exit_code: int

    def show(self, file: IO[Any] | None = None) -> None: ...


def _one_line(text: str) -> str:
    """A message's lines joined, so stderr gets the one line the CLI promises."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _log_internal_error(err: Exception) -> str:
    """Log the traceback of a bug and say where it went: the process' log when logging is
    set up (the worker's stderr), else a file: the data directory's, or the system temp
    folder's when the data directory is the thing that is broken."""
    if logging.getLogger().handlers:
        log.error("internal error in %s", " ".join(sys.argv), exc_info=err)
        return "the log"
    for path in _log_files():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(path, encoding="utf-8")
        except OSError:
            continue
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.error("internal error in %s", " ".join(sys.argv), exc_info=err)
        log.removeHandler(handler)
        handler.close()
        return str(path)
    traceback.print_exception(err)  # nowhere to write it: the traceback is all there is
    return "the traceback above"


def _log_files() -> list[Path]:
    """Where a CLI traceback may go, in order of preference."""
    from storage.settings import Settings

    spare = Path(tempfile.gettempdir()) / "kvscope-cli.log"
    try:
        return [Settings().data_dir / "logs" / "cli.log", spare]
    except ValueError:  # settings refused: an InvalidInput from the command, not a bug
        return [spare]


def main() -> None:
    """Entry point of the console script and `python -m app.cli`: run a command, turn what
    it raises into a line on stderr and an exit code."""
    try:
        rc = app(standalone_mode=False)
    except KvscopeError as err:
        typer.echo(f"error: {_one_line(str(err))}", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except _CLICK_ERROR as err:  # unknown command or option, a bad value: usage, exit 2
        usage = cast(_ClickError, err)
        usage.show()
        sys.exit(usage.exit_code)
    except Exception as err:
        where = _log_internal_error(err)
        typer.echo(
            f"error: internal error: {type(err).__name__}: {_one_line(str(err))} "
            f"(details in {where})",
            err=True,
        )
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)
