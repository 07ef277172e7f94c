"""The HTTP front end: OpenAI-compatible and SGLang-native endpoints over an engine core in its own process.

    kestrel serve --model k3-tiny            # then: curl http://127.0.0.1:30000/v1/models

Layout: `protocol` (request bodies and error shapes), `engine_proc` (the core process loop), `engine_client` (the
front end's side of the ZMQ channel), `openai_api` (completions and chat), `app` (the FastAPI app and its other
routes), `metrics` (Prometheus), `bench` (the serving benchmark), `cli` (the `serve` and `bench` commands).
"""
