"""The API's calls that change jobs, and the ranks' progress and checkpoint reports.

A job added, removed, a recovery approved, a node returned to a spare pool: each is
recorded by the audit trail before the change, and the record corrected if the
orchestrator refuses it. Only an admin token may post a job that names a program or a
URL for the controller to call.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import msgspec

from sn_monitor.config import ConfigError
from sn_monitor.controller.errors import Forbidden, Invalid, Malformed, NotFound
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.settings import UnknownJob
from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.controller.service.audit_trail import AuditTrail
from sn_monitor.model import CheckpointBody, ProgressBody

log = logging.getLogger(__name__)

#: Job controls that make the controller run a program or call a URL: from job files
#: (configuration) or an admin token only, never from an operate token.
ADMIN_ONLY_CONTROL = frozenset({"webhook", "command"})


class JobDesk:
    """The jobs' API calls (module docstring)."""

    def __init__(self, jobs: JobOrchestrator, audit: AuditTrail) -> None:
        self._jobs = jobs
        self._audit = audit

    def add_job(self, body: bytes, who: str, admin: bool = False) -> dict[str, Any]:
        """A DistributedJob from the API; only ``admin`` may name a program or a URL."""
        try:
            job = job_from_json(body)
        except ConfigError as err:
            raise Invalid(str(err)) from None
        control = job.spec.control
        if control is not None and control.kind in ADMIN_ONLY_CONTROL and not admin:
            # A program to run or a URL to call (with a secret file to read) is a choice
            # for whoever configures the controller, not for an operate token.
            raise Forbidden(f"spec.control.{control.kind}: only an admin token may post "
                           "a job that names a program or a URL for the controller to call; "
                           "put the job in the controller's --jobs directory, or use "
                           "kubernetes or slurm control")
        # The spec stays out of the audit record: its control may carry a secret.
        with self._audit.audited("add-job", who, f"job {job.name} added",
                                 params={"job": job.name}):
            status = self._jobs.add_job(job, f"api:{who}")
        log.info("job %s added by %s", job.name, who)
        return status.to_dict()

    def delete_job(self, name: str, who: str) -> None:
        if self._jobs.job(name) is None:
            raise NotFound(f"no job {name!r}")
        with self._audit.audited("delete-job", who, f"job {name} removed",
                                 params={"job": name}) as audit:
            if not self._jobs.remove_job(name):  # removed by someone else in between
                self._audit.refused(audit, "no such job")
                raise NotFound(f"no job {name!r}")
        log.info("job %s removed by %s", name, who)

    def approve_recovery(self, recovery_id: str, who: str) -> dict[str, Any]:
        with self._audit.audited("approve-recovery", who, f"recovery {recovery_id} approved",
                                 params={"recovery": recovery_id},
                                 unknown=("no such recovery", f"no recovery {recovery_id!r}")):
            return self._jobs.approve_recovery(recovery_id, who).to_dict()

    def return_to_pool(self, job: str, node: str, who: str) -> dict[str, Any]:
        with self._audit.audited("return-to-pool", who,
                                 f"{node} back in the spare pool of {job}",
                                 node=node, params={"job": job},
                                 unknown=("no such job", f"no job {job!r}")):
            status = self._jobs.return_to_pool(job, node)
        log.info("node %s returned to the spare pool of %s by %s", node, job, who)
        return status.to_dict()

    def job_progress(self, name: str, body: bytes) -> dict[str, Any]:
        progress = _decode(_progress_decoder, body)
        try:
            reply = self._jobs.progress(
                name, progress.rank, progress.node, progress.world_size,
                [(u.step, u.time) for u in progress.updates], progress.step_time_seconds)
        except UnknownJob:
            raise NotFound(f"no job {name!r}") from None
        except ValueError as err:
            raise Invalid(str(err)) from None
        return reply.to_dict()

    def job_checkpoint(self, name: str, body: bytes) -> dict[str, Any]:
        saved = _decode(_checkpoint_decoder, body)
        try:
            checkpoint = self._jobs.checkpoint_saved(name, saved.rank, saved.node, saved.step,
                                                     saved.path, saved.save_seconds)
        except UnknownJob:
            raise NotFound(f"no job {name!r}") from None
        except (ValueError, OSError) as err:
            raise Invalid(str(err)) from None
        return {"step": checkpoint.step, "path": str(checkpoint.path),
                "complete": checkpoint.complete, "reason": checkpoint.reason}


_progress_decoder = msgspec.json.Decoder(ProgressBody)
_checkpoint_decoder = msgspec.json.Decoder(CheckpointBody)

_T = TypeVar("_T")


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes) -> _T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as err:
        raise Invalid(f"invalid body: {err}") from None
    except msgspec.DecodeError as err:
        raise Malformed(f"malformed JSON: {err}") from None
