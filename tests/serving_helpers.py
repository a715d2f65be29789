"""Helpers shared by tests/test_serve.py, tests/test_endpoint.py and the distill tests: a tiny random HF
checkpoint with the toy tokenizer, a free port, `mocojax.serve` in a subprocess, and an ASGI app
served by uvicorn in a thread."""

import base64
import contextlib
import io
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import uvicorn
from PIL import Image

from mocojax import hf, model, processing
from mocojax.data import toyroles

PIXELS = 64 * 64  # every image is resized to this many pixels (16 patches): fast on the CPU


def tiny_hf_dir(path):
    """Writes a tiny random Qwen3-VL (toy tokenizer, random weights) as an HF directory; returns path."""
    tokenizer_dir = toyroles.build_tokenizer(os.path.join(path, "tokenizer"))
    processor = processing.Processor(processing.load_tokenizer(tokenizer_dir))
    cfg = model.tiny(
        vocab_size=-(-len(processor.tokenizer) // 64) * 64,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        vision_depth=1,
        vision_hidden=32,
        deepstack=(0,),
        image_token_id=processor.image_token_id,
        video_token_id=processor.video_token_id,
        vision_start_token_id=processor.vision_start_token_id,
        vision_end_token_id=processor.vision_end_token_id,
    )
    out = os.path.join(path, "hf")
    hf.save_pretrained(out, cfg, model.init_params(cfg, 0), tokenizer_path=tokenizer_dir)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data_url(size=(70, 45), colour=(200, 30, 60), fmt="PNG"):
    """Returns a data: URL of a solid image of an odd size."""
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


@contextlib.contextmanager
def served(model_dir, *extra, startup_s=240):
    """Runs `python -m mocojax.serve` on a free port; yields its base URL (.../v1); always stops it."""
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mocojax.serve",
            "--model",
            model_dir,
            "--port",
            str(port),
            "--min_pixels",
            str(PIXELS),
            "--max_pixels",
            str(PIXELS),
            "--name",
            "tiny",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mocojax.serve exited {proc.returncode}:\n{proc.stdout.read()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mocojax.serve did not come up")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def app_in_thread(app):
    """Serves an ASGI app (uvicorn in a daemon thread) on a free port; yields http://127.0.0.1:PORT."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
