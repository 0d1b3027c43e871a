"""Who a GPU process is, from a /proc tree: command, user, container, pod; a reused pid re-read."""

from __future__ import annotations

from pathlib import Path

from sn_monitor.agent.workloads.processes import (
    MAX_COMMAND_CHARS,
    ProcessIdentities,
    ProcessIdentity,
    passwd_user_name,
)
from sn_monitor.sim.node_tree import SimulatedNodeTree
from tests.conftest import FIXTURES

PROC = FIXTURES / "h100-node" / "proc"
ID = "3f2b8c1d9e0a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c"
ID2 = "5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b"
POD = "8e1a2c4b-5d6f-4a7b-9c8d-0e1f2a3b4c5d"
USERS = {0: "root", 1000: "alice", 2000: "bob"}


def names(uid: int) -> str:
    return USERS.get(uid, str(uid))


def write_process(procfs: Path, pid: int, *, start: int, argv: tuple[str, ...] = ("python3",),
                  comm: str = "pt_main_thread", uid: int = 1000, cgroup: str = "/") -> None:
    """A /proc/<pid>/ as the kernel writes the four files the identity reads."""
    base = procfs / str(pid)
    base.mkdir(parents=True, exist_ok=True)
    fields = [1, pid, pid, 0, -1, 4194560, 0, 0, 0, 0, 10, 5, 0, 0, 20, 0, 1, 0, start, 10**8]
    (base / "stat").write_text(f"{pid} ({comm}) S {' '.join(map(str, fields))} 0 0\n")
    (base / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (base / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (base / "cgroup").write_text(f"0::{cgroup}\n")


def test_a_gpu_process_of_the_fixture_node_is_identified() -> None:
    known = ProcessIdentities(PROC, names).identify([4242, 4243, 1])
    # argv[0]'s base name, not the comm PyTorch renames its main thread to
    assert known[4242] == ProcessIdentity(4242, "python3", "root", ID, POD)
    # no cmdline or status readable: comm, and no user
    assert known[4243] == ProcessIdentity(4243, "python3", None, ID2, None)
    assert known[1] == ProcessIdentity(1, "systemd", None, None, None)


def test_a_gone_process_keeps_its_pid_only() -> None:
    assert ProcessIdentities(PROC, names).identify([999999]) == {999999: ProcessIdentity(999999)}


def test_a_reused_pid_never_gets_the_previous_owners_identity(tmp_path: Path) -> None:
    write_process(tmp_path, 77, start=100, argv=("/usr/bin/python3", "train.py"), uid=1000)
    identities = ProcessIdentities(tmp_path, names)
    assert identities.identify([77])[77].user == "alice"
    # The same process (same start time): served from memory, its files not read again.
    (tmp_path / "77" / "cmdline").write_bytes(b"renamed\0")
    assert identities.identify([77])[77].command == "python3"
    # The pid handed to another process (another start time): read afresh.
    write_process(tmp_path, 77, start=250, argv=("/opt/bin/vllm",), uid=2000)
    again = identities.identify([77])[77]
    assert (again.command, again.user) == ("vllm", "bob")


def test_only_the_latest_cycles_processes_stay_cached(tmp_path: Path) -> None:
    write_process(tmp_path, 5, start=10, argv=("a",))
    write_process(tmp_path, 6, start=10, argv=("c",))
    identities = ProcessIdentities(tmp_path, names)
    assert identities.identify([5])[5].command == "a"
    assert identities.identify([6])[6].command == "c"  # another GPU, the same cycle
    identities.end_cycle()
    (tmp_path / "6" / "cmdline").write_bytes(b"d\0")
    assert identities.identify([6])[6].command == "c"  # asked last cycle: kept
    identities.end_cycle()  # pid 5 left the GPU
    (tmp_path / "5" / "cmdline").write_bytes(b"b\0")
    assert identities.identify([5])[5].command == "b"


def test_each_uid_is_resolved_once_and_a_long_command_is_cut(tmp_path: Path) -> None:
    asked: list[int] = []

    def counting(uid: int) -> str:
        asked.append(uid)
        return names(uid)

    write_process(tmp_path, 1, start=1, uid=1000, argv=("x" * 200,))
    write_process(tmp_path, 2, start=2, uid=1000)
    known = ProcessIdentities(tmp_path, counting).identify([1, 2, 2])
    assert asked == [1000]
    assert known[1].command == "x" * MAX_COMMAND_CHARS


def test_an_unknown_uid_is_its_number() -> None:
    assert passwd_user_name(0) == "root"
    assert passwd_user_name(3_999_999) == "3999999"


def test_the_simulated_node_writes_a_gpu_process_as_proc_shows_it(tmp_path: Path) -> None:
    tree = SimulatedNodeTree(tmp_path)
    tree.add_gpu_process(4242, ["/usr/bin/python3", "train.py"], uid=0,
                         cgroup=f"/kubepods/besteffort/pod{POD}/{ID}")
    assert ProcessIdentities(tree.procfs, names).identify([4242])[4242] == ProcessIdentity(
        4242, "python3", "root", ID, POD)
