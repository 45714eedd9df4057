"""Serving a model over HTTP: `tuneline api` (OpenAI's chat completions) and `tuneline webchat`.

`sources` reads what to serve (an inference YAML, a folder, a registered version), `backends` checks
`infer_backend`, `protocol` reads requests and writes OpenAI's bodies, `engine` generates with
transformers, `tool_calls` reads tool calls back from answers, `app` is the FastAPI app (and
`webchat.html` its page), `server` runs it with uvicorn.
"""
