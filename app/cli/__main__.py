"""`python -m app.cli`: how `kvscope up` starts the worker, and how tests run the CLI."""

from app.cli import main

main()
