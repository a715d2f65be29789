"""The requests of mocojax.serve: RequestError, the chat-completion fields it refuses
(_UNSUPPORTED), and `parse_request`, which checks an OpenAI-style body (messages, text and base64
`data:` image items, sampling settings) into a Request. Split from mocojax/serve.py, which
re-exports these names."""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import dataclasses

from mocojax import processing

_UNSUPPORTED = {
    "stream": (None, False),
    "stop": (None, [], ""),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "response_format": (None, {"type": "text"}),
}


class RequestError(ValueError):
    """A request the server cannot answer as asked (HTTP 400, the message says why)."""


# ----------------------------------------------------------------------------------------------
# Requests
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Request:
    conversation: list  # processing's message format (PIL images inline)
    max_tokens: int
    temperature: float
    top_p: float
    n: int
    seed: int | None
    logprobs: bool
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)

    def group_key(self):
        """Requests with equal keys share one sampler call."""
        if self.temperature == 0:
            return ("greedy", self.n)
        if self.seed is not None:
            return ("seeded", id(self))
        return ("sampled", self.temperature, self.top_p, self.n)


def _image(url, where, max_image_pixels):
    if not isinstance(url, str) or not url.startswith("data:"):
        raise RequestError(
            f"{where}: only base64 data: URLs are accepted (the server fetches nothing), "
            f"got {str(url)[:40]!r}"
        )
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise RequestError(f"{where}: want data:image/...;base64,<payload>")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestError(f"{where}: bad base64 payload: {e}") from None
    try:
        return processing.load_image(data, max_image_pixels=max_image_pixels)
    except processing.ImageError as e:
        raise RequestError(f"{where}: {e}") from None


def _content(content, where, max_image_pixels):
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of parts")
    parts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else image_url
            parts.append(
                {"type": "image", "image": _image(url, f"{where} part {k}", max_image_pixels)}
            )
        else:
            raise RequestError(
                f"{where} part {k}: want {{'type': 'text', 'text': ...}} or "
                f"{{'type': 'image_url', 'image_url': {{'url': 'data:...'}}}}"
            )
    return parts


def _number(body, key, default, kind, low, high):
    value = body.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise RequestError(
            f"{key} must be {'a number' if kind is float else 'an integer'}, got {value!r}"
        )
    if not low <= value <= high:
        raise RequestError(f"{key}={value} is outside [{low}, {high}]")
    return kind(value)


def parse_request(body, *, max_tokens_limit, max_n, max_image_pixels=processing.MAX_IMAGE_PIXELS):
    """Returns the Request of a /v1/chat/completions JSON body, or raises RequestError."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    for key, allowed in _UNSUPPORTED.items():
        if body.get(key) not in allowed:
            raise RequestError(f"{key}={body[key]!r} is not supported by this server")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    conversation = []
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in (
            "system",
            "user",
            "assistant",
        ):
            raise RequestError(
                f"message {k}: want {{'role': system|user|assistant, 'content': ...}}"
            )
        content = _content(message.get("content", ""), f"message {k}", max_image_pixels)
        conversation.append({"role": message["role"], "content": content})
    if conversation[-1]["role"] == "assistant":
        raise RequestError("the last message must be a user (or system) message")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"seed must be an integer, got {seed!r}")
    return Request(
        conversation=conversation,
        max_tokens=_number(
            body, "max_tokens", min(256, max_tokens_limit), int, 1, max_tokens_limit
        ),
        temperature=_number(body, "temperature", 1.0, float, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, float, 1e-6, 1.0),
        n=_number(body, "n", 1, int, 1, max_n),
        seed=seed,
        logprobs=bool(body.get("logprobs")),
    )
