"""``stallfree serve`` as a user runs it: a subprocess, flags plumbed through, clean shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import openai


def test_serve_subprocess_with_flags() -> None:
    argv = [sys.executable, "-c", "import sys; from stallfree.cli import main; sys.exit(main())", "serve"]
    argv += ["--model", "random:tiny", "--dtype", "float32", "--device", "cpu", "--port", "0"]
    argv += ["--served-model-name", "alias", "--policy", "chunked", "--chunk-tokens", "32"]
    argv += ["--max-num-seqs", "8", "--num-blocks", "256", "--api-key", "k", "--log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()  # printed once the model is loaded, before serving
        budget, weights = proc.stderr.readline(), proc.stderr.readline()
        assert "256 KV blocks" in banner and budget.strip() == "chunked, 32-token chunks"
        assert weights.strip().startswith("float32 activations and KV cache") and weights.strip().endswith(
            "as asked"
        )
        base_url = banner.rsplit(" on ", 1)[1].strip()
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="k", max_retries=5)
        assert [m.id for m in client.models.list()] == ["alias"]
        out = client.completions.create(
            model="alias", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert out.usage is not None and out.usage.completion_tokens == 3
        assert httpx.get(f"{base_url}/v1/models").status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: graceful shutdown
        proc.wait(30)
    assert proc.returncode in (0, -signal.SIGINT, 130)
