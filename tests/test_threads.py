"""The SDK's blocking calls keep running while stuck user code holds every default thread."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.threads import UserCodeExecutor, run_blocking


async def test_stuck_tools_on_the_default_executor_do_not_starve_sdk_calls():
    release = threading.Event()
    loop = asyncio.get_running_loop()
    # More stuck "sync tools" than the default executor has threads (cpus + 4).
    stuck = [loop.run_in_executor(None, release.wait) for _ in range((os.cpu_count() or 1) + 8)]
    try:
        with_default = asyncio.to_thread(lambda: "update")
        try:
            await asyncio.wait_for(asyncio.shield(with_default), 0.5)
            raise AssertionError("the default executor was expected to be full")
        except TimeoutError:
            pass
        assert await asyncio.wait_for(run_blocking(lambda x: x + 1, 41), 5) == 42
    finally:
        release.set()
        await asyncio.gather(*stuck)


def test_rollouts_have_a_default_timeout():
    assert RolloutConfig().timeout_s == 1800.0
    assert RolloutConfig(timeout_s=None).timeout_s is None


def test_a_user_code_pool_thread_ends_after_idling_and_the_pool_still_serves():
    pool = UserCodeExecutor(2, thread_name_prefix="idle-test", idle_s=0.1)
    assert pool.submit(lambda: 1).result(5) == 1
    for _ in range(100):
        if not [t for t in threading.enumerate() if t.name.startswith("idle-test")]:
            break
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("idle-test")]
    assert pool.submit(lambda: 2).result(5) == 2
    pool.shutdown()
