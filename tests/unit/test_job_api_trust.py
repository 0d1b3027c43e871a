"""Jobs through the API: who may make the controller run a program or call a URL.

A job's ``spec.control`` is what the controller runs (``command``) or calls
(``webhook``, with a secret it signs with) at checkpoint and restore. From an operate
token that would be a way to run anything on the controller's host, or to send signed
requests anywhere: only job files (the controller's configuration) and admin tokens may
name one. Whatever the source, the API never shows a webhook's secret or header values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.api import ADMIN, OPERATE, READ, make_api
from tests.support.audit import _job

CONTROLS: dict[str, Any] = {
    "command": {"command": ["/bin/true"]},
    "webhook": {"webhook": {"url": "http://127.0.0.1:9/control", "secret": "s3cret-value",
                            "headers": {"X-Launcher-Key": "k3y-value"}}},
}


@pytest.mark.parametrize("kind", sorted(CONTROLS))
def test_an_operate_token_may_not_name_a_program_or_url(tmp_path: Path, kind: str) -> None:
    client, h = make_api(tmp_path)
    try:
        with client.client:
            spec = _job(tmp_path)
            spec["spec"]["control"] = CONTROLS[kind]
            refused = client.post("/api/v1/jobs", json=spec, token=OPERATE)
            assert refused.status_code == 403, refused.text
            assert f"spec.control.{kind}" in refused.json()["error"]
            assert h.controller.jobs.job("llm") is None
            # the job's own Slurm batch job: the configured driver acts on it
            spec["spec"]["control"] = {"slurm": {"jobId": 4242}}
            assert client.post("/api/v1/jobs", json=spec, token=OPERATE).status_code == 201
    finally:
        h.controller.close()
        h.store.close()


def test_an_admin_may_and_nobody_reads_the_secret_back(tmp_path: Path) -> None:
    client, h = make_api(tmp_path)
    try:
        with client.client:
            spec = _job(tmp_path)
            spec["spec"]["control"] = CONTROLS["webhook"]
            created = client.post("/api/v1/jobs", json=spec, token=ADMIN)
            assert created.status_code == 201, created.text
            for token in (READ, ADMIN):
                for path in ("/api/v1/jobs/llm", "/api/v1/jobs"):
                    text = client.get(path, token=token).text
                    assert "s3cret-value" not in text
                    assert "k3y-value" not in text
            doc = client.get("/api/v1/jobs/llm", token=READ).json()
            hook = doc["spec"]["spec"]["control"]["webhook"]
            assert hook["secret"] == "<redacted>"
            assert hook["headers"] == {"X-Launcher-Key": "<redacted>"}
            assert hook["url"] == "http://127.0.0.1:9/control"
            # the controller itself still has them: it signs with the secret
            control = h.controller.jobs.spec("llm").spec.control  # type: ignore[union-attr]
            assert control is not None
            assert control.webhook is not None
            assert control.webhook.secret == "s3cret-value"
    finally:
        h.controller.close()
        h.store.close()
