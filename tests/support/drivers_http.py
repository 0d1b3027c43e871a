"""An action request as the controller hands it to a driver, with any field overridden;
shared by the HTTP-driver tests and the webhook trust tests."""

from __future__ import annotations

from sn_monitor.controller.audit import ActionRequest


def request(**overrides: object) -> ActionRequest:
    fields: dict[str, object] = dict(
        id="act-1", key="k-1", action="alert", node="gpu-node-017", reason="GPU 3 at 91 C",
        rule="gpu-overheat", incident_id=42, gpu=3, severity="critical",
        labels={"rack": "r12"}, params={"status": "firing"}, created_seconds=1_700_000_000.0)
    fields.update(overrides)
    return ActionRequest(**fields)  # type: ignore[arg-type]
