"""The OpenAI-compatible API (`--openai-port`): `create_openai_app` builds its aiohttp application
from what `load_openai_serving` read at start-up.

    server.py         routes (with and without a trailing slash), the "openai" restricted group (401)
    cors.py           --openai-cors-origin: preflights and the allow-origin header
    serving.py        what the port is set up with: template, tokenizer, parser, context length
    request_body.py   completion and chat bodies, checked (400 naming the field)
      sampling.py     vLLM's sampling fields, passed through;  structured.py  response_format, guided_*
      tools.py        tools, tool_choice, parallel_tool_calls
    plan.py           what the model is asked, decided before it runs (guided decoding, parser, context)
    contract.py       the model contracts (Triton's OpenAI frontend's tensor names), the InferRequest
    generation.py     completions and chat: n choices, whole or streamed (SSE), cancellation on client close
      responses.py    the choices' response streams, merged;  choice.py  one choice's text
      stop.py         stop strings enforced;  tool_calls/  the --tool-call-parser parsers
      logprobs.py     the logprobs output and OpenAI's two forms of it
    embeddings.py     /v1/embeddings (float or base64, dimensions)
    chat_template.py  --tokenizer / --chat-template: messages (and tools) to a prompt (jinja2)
    tokens.py         token counts (the tokenizers library) or words; token-id prompts
    documents.py      the response documents;  errors.py  OpenAI's error body and status codes
"""

from pystub_backend.backend.frontends.openai.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from pystub_backend.backend.frontends.openai.server import create_openai_app
from pystub_backend.backend.frontends.openai.serving import OpenAIServing, OpenAISetupError, load_openai_serving

__all__ = ["create_openai_app", "ChatTemplate", "ChatTemplateError", "load_chat_template", "OpenAIServing",
           "OpenAISetupError", "load_openai_serving"]
