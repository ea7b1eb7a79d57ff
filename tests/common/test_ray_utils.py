"""``init_ray`` retries a local start that misses Ray's start-up deadline (a loaded 2-core box), and does not
retry joining an address. Ray itself is replaced by a fake here: the real start-up is covered by every Ray
test (``ray_cluster`` fixture) and by ``make run``."""

from __future__ import annotations

import pytest
import ray

from services.common import ray_utils


class FakeRay:
    def __init__(self, failures: int):
        self.failures = failures
        self.calls: list[dict] = []
        self.shutdowns = 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **kw):
        self.calls.append(kw)
        if len(self.calls) <= self.failures:
            raise Exception("node timed out during startup")

    def shutdown(self):
        self.shutdowns += 1


@pytest.fixture
def fake(monkeypatch):
    def make(failures: int) -> FakeRay:
        f = FakeRay(failures)
        for name in ("is_initialized", "init", "shutdown"):
            monkeypatch.setattr(ray, name, getattr(f, name))
        monkeypatch.setattr(ray_utils.time, "sleep", lambda s: None)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        return f

    return make


def test_local_start_is_retried(fake, capsys):
    f = fake(failures=2)
    assert ray_utils.init_ray(num_cpus=2).startswith("started local Ray cluster")
    assert len(f.calls) == 3 and f.shutdowns == 2  # each failed attempt is cleaned up before the next
    assert "attempt 1/3" in capsys.readouterr().err


def test_gives_up_after_the_last_attempt(fake):
    f = fake(failures=5)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_utils.init_ray(num_cpus=2, start_attempts=2)
    assert len(f.calls) == 2


def test_joining_an_address_is_not_retried(fake):
    f = fake(failures=1)
    with pytest.raises(Exception, match="timed out"):
        ray_utils.init_ray(address="ray://nowhere:10001")
    assert len(f.calls) == 1
