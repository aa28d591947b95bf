#!/usr/bin/env python3
"""A stand-in `vllm` executable for manager tests: `fake_engine.py serve MODEL --port N ...`.

It prints vLLM-like startup lines, answers /health, /v1/models and /metrics, spawns a child
(as vLLM spawns EngineCore) and can be told to crash (`FAKE_ENGINE_CRASH_AFTER_S`). Stdlib
only. Tests of the real engine use vLLM itself (tests/e2e).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    name = args[args.index("--served-model-name") + 1] if "--served-model-name" in args else "m"
    delay = float(os.environ.get("FAKE_ENGINE_START_S", "0.5"))
    print(f"(APIServer pid={os.getpid()}) INFO 01-01 00:00:00 [api.py:1] starting", flush=True)
    # A child in the same process group, like vLLM's EngineCore.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    time.sleep(delay)
    print(
        f"(EngineCore pid={child.pid}) INFO 01-01 00:00:01 [kv_cache_utils.py:1] CPU KV "
        "cache size: 16,384 tokens, Maximum concurrency for 8,192 tokens per request: 2.00x",
        flush=True,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            bodies = {
                "/health": "",
                "/v1/models": json.dumps({"data": [{"id": name}]}),
                "/metrics": f'vllm:num_requests_running{{model_name="{name}"}} 0.0\n',
            }
            if self.path not in bodies:
                self.send_response(404)
                self.end_headers()
                return
            body = bodies[self.path].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    crash_after = os.environ.get("FAKE_ENGINE_CRASH_AFTER_S")
    if crash_after:

        def crash() -> None:
            time.sleep(float(crash_after))
            print("Traceback (most recent call last):", flush=True)
            print('  File "engine.py", line 1, in step', flush=True)
            print("RuntimeError: fake engine died", flush=True)
            os._exit(3)

        threading.Thread(target=crash, daemon=True).start()
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
