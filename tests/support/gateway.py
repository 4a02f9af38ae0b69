"""LiteLLM's proxy on loopback, in front of a model server: the gateway most teams use.

It is installed from the package registry with the dev extras (`litellm[proxy]`) and
started here as its own process, bound to 127.0.0.1, with one deployment whose `rpm`
it enforces itself: past it, it answers 429 with the wait in `llm_provider-retry-after`
(never `retry-after`), as it does in front of real providers. It gives up no request
to retries of its own (`num_retries: 0`): what Relay does with a 429 is what is seen.
Stopped by its pid when the test ends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.redis_server import free_port

__all__ = ["Gateway"]

MASTER_KEY = "sk-relay-test-gateway-0123456789abcdef"
"""The proxy's key: the workers send it as RELAY_MODEL_KEY (or a route's key)."""


class Gateway:
    """`with Gateway(tmp_path, model_url, rpm=3) as gateway: gateway.url` — LiteLLM's proxy
    serving model "m" from `model_url` (an OpenAI-compatible base URL)."""

    def __init__(self, directory: Path, model_url: str, *, rpm: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.key = MASTER_KEY
        self.log_path = directory / "gateway.log"
        self._config = directory / "gateway.yaml"
        self._config.write_text(
            "model_list:\n"
            "  - model_name: m\n"
            "    litellm_params:\n"
            "      model: openai/m\n"
            f"      api_base: {model_url}\n"
            "      api_key: sk-upstream\n"
            f"      rpm: {rpm}\n"
            "router_settings:\n"
            "  routing_strategy: usage-based-routing-v2\n"
            "  enable_pre_call_checks: true\n"
            "litellm_settings:\n"
            "  num_retries: 0\n"
        )
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Gateway:
        program = Path(sys.executable).parent / "litellm"
        if not program.exists():
            missing = f"LiteLLM's proxy is not installed ({program}): pip install -e '.[dev]'"
            if os.environ.get("RELAY_TEST_REQUIRE_GATEWAY") == "1":
                pytest.fail(f"{missing}, and RELAY_TEST_REQUIRE_GATEWAY=1 needs it")
            pytest.skip(missing)
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": self.key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch from the network at start
            "LITELLM_TELEMETRY": "False",
        }
        args = [str(program), "--config", str(self._config), "--host", "127.0.0.1"]
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [*args, "--port", str(self.port)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_until_up(90)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _wait_until_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"the gateway exited:\n{self.output()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health/liveliness").is_success:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the gateway did not come up in {timeout:g} s")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def answered(self, status: int) -> int:
        """How many chat completions the gateway answered with `status` (its access log)."""
        line = re.compile(rf'"POST /v1/chat/completions HTTP/1\.1" {status}\b')
        return len(line.findall(self.output()))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
