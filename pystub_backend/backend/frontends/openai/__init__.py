"""The OpenAI-compatible API (`--openai-port`): `create_openai_app` builds its aiohttp application.

    server.py         routes, the "openai" restricted group
    request_body.py   completion and chat bodies, checked (400 naming the field)
    contract.py       the model contracts (Triton's OpenAI frontend's tensor names), the InferRequest
    generation.py     completions and chat: whole or streamed (SSE), cancellation on client close
    embeddings.py     /v1/embeddings (float or base64)
    chat_template.py  --tokenizer / --chat-template: messages to a prompt (jinja2)
    documents.py      the response documents;  errors.py  OpenAI's error body and status codes
"""

from pystub_backend.backend.frontends.openai.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from pystub_backend.backend.frontends.openai.server import create_openai_app

__all__ = ["create_openai_app", "ChatTemplate", "ChatTemplateError", "load_chat_template"]
