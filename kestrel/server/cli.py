"""`kestrel serve` and `kestrel bench`."""

import argparse
import asyncio
import logging
import signal

from kestrel.config import ServerArgs

log = logging.getLogger(__name__)


# ---- serve
def add_serve_args(p: argparse.ArgumentParser) -> None:
    ServerArgs.add_cli_args(p)


def run_serve(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(serve(ServerArgs.from_cli(args)))
    except KeyboardInterrupt:
        return 130


async def serve(args: ServerArgs) -> int:
    """Start the engine core, then HTTP; SIGINT / SIGTERM stop both (the core joined, the sockets closed)."""
    import uvicorn

    from kestrel.server.app import build_app
    from kestrel.server.engine_client import EngineClient
    from kestrel.server.serving import Served

    client = EngineClient(args)
    try:
        info = await client.start()
    except RuntimeError as e:
        log.error("%s", e)
        await client.shutdown()
        return 1
    app = build_app(Served(args, client, info["model_name"], info["context_len"], info["vocab_size"],
                           info["tokenizer"]))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                            access_log=args.log_level.lower() == "debug", timeout_graceful_shutdown=5,
                            # longer than clients' keep-alive expiry (httpx: 5 s), so that a client never reuses a
                            # connection the server is closing
                            timeout_keep_alive=30)
    loop = asyncio.get_running_loop()

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            # end the streams now instead of waiting for them through the graceful-shutdown timeout
            loop.call_soon_threadsafe(client.fail_all, "the server is shutting down")

    server = Server(config)
    announce = asyncio.create_task(_announce(server, args, info))
    # uvicorn re-raises the signal it stopped on once it has restored these: let that be a no-op, so that the
    # engine core is still stopped below
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    try:
        await server.serve()
    finally:
        announce.cancel()
        await client.shutdown()
        log.info("shut down")
    return 0 if server.started else 1


async def _announce(server, args: ServerArgs, info: dict) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    print(usage_banner(args.host, args.port, info["model_name"], args.api_key is not None,
                       info["tokenizer"] is not None), flush=True)


def usage_banner(host: str, port: int, model: str, has_key: bool, has_tokenizer: bool) -> str:
    """Ready-to-paste curl and openai-client examples for this server."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    key_header = ' -H "Authorization: Bearer $KESTREL_API_KEY"' if has_key else ""
    key_arg = 'os.environ["KESTREL_API_KEY"]' if has_key else '"EMPTY"'
    if has_tokenizer:
        route = "chat/completions"
        body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'
        call = (f'out = client.chat.completions.create(model="{model}", max_tokens=32,\n'
                f'                                     messages=[{{"role": "user", "content": "Hello!"}}])\n'
                f'print(out.choices[0].message.content)')
    else:
        route, body = "completions", f'{{"model": "{model}", "prompt": [1, 2, 3], "max_tokens": 8}}'
        call = f'out = client.completions.create(model="{model}", prompt=[1, 2, 3], max_tokens=8)\nprint(out)'
    lines = [
        f"Kestrel is serving {model!r} at {base} (OpenAI API under /v1; /generate, /health, /metrics).",
        *(["The API key is required: export KESTREL_API_KEY=<the --api-key value>"] if has_key else []),
        "",
        "  curl:",
        f"    curl {base}/v1/{route} -H 'Content-Type: application/json'{key_header} \\",
        f"      -d '{body}'",
        "",
        "  Python (pip install openai):",
        *(["    import os"] if has_key else []),
        "    from openai import OpenAI",
        f'    client = OpenAI(base_url="{base}/v1", api_key={key_arg})',
        *("    " + line for line in call.splitlines()),
        "",
    ]
    return "\n".join(lines)


# ---- bench
def add_bench_args(p: argparse.ArgumentParser) -> None:
    from kestrel.server import bench

    bench.add_args(p)


def run_bench(args: argparse.Namespace) -> int:
    from kestrel.server import bench

    return bench.main(args)
