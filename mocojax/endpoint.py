"""A client for any OpenAI-compatible chat endpoint (mocojax.serve, vLLM, SGLang, hosted APIs).

  client = EndpointClient("http://127.0.0.1:8000/v1", "tiny", cache_dir="runs/x/endpoint_cache")
  replies = client.chat_many([{"messages": [...], "temperature": 0, "max_tokens": 64}, ...])
  texts = [r["choices"][0]["message"]["content"] for r in replies]

* Retries: connection errors, timeouts, a dropped connection, HTTP 429 and 5xx, and a 200 whose
  body is not a chat.completion, with exponential backoff (base * 2**attempt, jittered, capped;
  a Retry-After header is honoured up to the cap). Other 4xx are the request's fault and raise
  at once. After max_retries an EndpointError names the URL, the attempts and the last failure.
* Concurrency: at most `concurrency` requests in flight (a thread pool over one httpx.Client).
* Timeout: `timeout` seconds per HTTP request (connect, each read, write).
* Cache: with cache_dir, each successful reply is stored under the SHA-256 of the request (URL,
  model and body, never the API key), written to a temporary file and renamed into place, so a
  killed run leaves no half-written entry and a rerun sends only the requests it has no reply for.
* Progress: a tqdm bar over the requests of chat_many (cached ones count at once).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import io
import json
import os
import random
import tempfile
import threading
import time

import httpx
from tqdm import tqdm


class EndpointError(RuntimeError):
    """A request the endpoint did not answer: the message names the URL, status and reason."""

    def __init__(self, message, status=None, retryable=False):
        super().__init__(message)
        self.status, self.retryable = status, retryable


def image_data_url(image, fmt="PNG"):
    """Returns a base64 data: URL of a PIL image (PNG, lossless)."""
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def user_message(text, images=()):
    """Returns an OpenAI user message: the images (PIL) first, then the text."""
    if not images:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": image_data_url(i)}} for i in images]
        + [{"type": "text", "text": text}],
    }


def _check_reply(reply):
    """Raises ValueError unless reply looks like a chat.completion with choices holding messages."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices)
    ):
        raise ValueError(f"not a chat.completion (no choices[].message): {json.dumps(reply)[:200]}")


class EndpointClient:
    """Chat completions from one model at one OpenAI-compatible base URL (.../v1)."""

    def __init__(
        self,
        base_url,
        model,
        *,
        api_key=None,
        concurrency=8,
        timeout=120.0,
        max_retries=5,
        backoff_s=0.5,
        max_backoff_s=30.0,
        cache_dir=None,
        progress=True,
        transport=None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {base_url!r}: want http(s)://host[:port]/v1")
        self.base_url, self.model = base_url.rstrip("/"), model
        self.url = f"{self.base_url}/chat/completions"
        self.concurrency, self.max_retries = max(1, int(concurrency)), max(0, int(max_retries))
        self.backoff_s, self.max_backoff_s, self.cache_dir, self.progress = (
            backoff_s,
            max_backoff_s,
            cache_dir,
            progress,
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            timeout=timeout,
            headers=headers,
            transport=transport,
            limits=httpx.Limits(max_connections=self.concurrency),
        )
        self.stats = {"sent": 0, "retries": 0, "cached": 0}
        self._lock = threading.Lock()
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)

    def close(self):
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- cache ---------------------------------------------------------------------------------

    def request_key(self, body):
        """Returns the SHA-256 hex of the request (URL + the body with its model), the cache key."""
        canonical = json.dumps(
            {"url": self.url, "body": {"model": self.model, **body}},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def _cache_path(self, key):
        return os.path.join(self.cache_dir, key[:2], f"{key}.json")

    def _cached(self, key):
        if not self.cache_dir:
            return None
        try:
            with open(self._cache_path(key)) as f:
                reply = json.load(f)
            _check_reply(reply)
            return reply
        except (OSError, ValueError):  # absent, or unreadable: ask again (and overwrite)
            return None

    def _store(self, key, reply):
        path = self._cache_path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(reply, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    # -- one request -----------------------------------------------------------------------------

    def _attempt(self, body):
        """Returns the reply of one POST, or raises EndpointError (retryable or not)."""
        try:
            response = self._http.post(self.url, json={"model": self.model, **body})
        except httpx.TimeoutException as e:
            raise EndpointError(
                f"POST {self.url}: timed out ({type(e).__name__})", retryable=True
            ) from None
        except httpx.TransportError as e:  # refused, reset, DNS, a dropped connection
            raise EndpointError(
                f"POST {self.url}: cannot reach the endpoint ({type(e).__name__}: {e})",
                retryable=True,
            ) from None
        with self._lock:
            self.stats["sent"] += 1
        if response.status_code != 200:
            try:
                detail = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                detail = response.text[:300]
            retryable = response.status_code == 429 or response.status_code >= 500
            error = EndpointError(
                f"POST {self.url}: HTTP {response.status_code}: {detail}",
                response.status_code,
                retryable,
            )
            error.retry_after = response.headers.get("retry-after")
            raise error
        try:
            reply = response.json()
            _check_reply(reply)
        except ValueError as e:
            raise EndpointError(
                f"POST {self.url}: malformed reply body: {e}", 200, retryable=True
            ) from None
        return reply

    def _delay(self, attempt, error):
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)
        retry_after = getattr(error, "retry_after", None)
        if retry_after:
            try:
                delay = max(delay, min(self.max_backoff_s, float(retry_after)))
            except ValueError:
                pass
        return delay

    def chat(self, body):
        """Returns the chat.completion reply of one request body (messages, temperature, ...):
        from the cache, or from the endpoint with retries; raises EndpointError."""
        key = self.request_key(body)
        reply = self._cached(key)
        if reply is not None:
            with self._lock:
                self.stats["cached"] += 1
            return reply
        for attempt in range(self.max_retries + 1):
            try:
                reply = self._attempt(body)
                break
            except EndpointError as error:
                if not error.retryable:
                    raise
                if attempt == self.max_retries:
                    raise EndpointError(
                        f"{error} (gave up after {attempt + 1} attempts)", error.status
                    ) from None
                with self._lock:
                    self.stats["retries"] += 1
                time.sleep(self._delay(attempt, error))
        if self.cache_dir:
            self._store(key, reply)
        return reply

    def chat_many(self, bodies, *, return_exceptions=False, desc="endpoint"):
        """Returns the replies of many request bodies in order, `concurrency` at a time. A failed
        request raises its EndpointError after the others have finished (and been cached), or is
        returned in its place with return_exceptions=True."""
        bodies = list(bodies)
        results = [None] * len(bodies)
        with (
            concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool,
            tqdm(total=len(bodies), desc=desc, disable=not self.progress, leave=False) as bar,
        ):
            futures = {pool.submit(self.chat, body): k for k, body in enumerate(bodies)}
            for future in concurrent.futures.as_completed(futures):
                k = futures[future]
                error = future.exception()
                results[k] = error if error is not None else future.result()
                bar.update(1)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and not return_exceptions:
            raise errors[0]
        return results


def texts(replies):
    """Returns the first choice's text of each reply (None where the reply is an exception)."""
    return [
        None if isinstance(r, BaseException) else r["choices"][0]["message"].get("content") or ""
        for r in replies
    ]
