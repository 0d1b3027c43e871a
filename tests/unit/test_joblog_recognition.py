"""Line and block recognition: real lines from public reports -> category, rank, params.

Every failure line below was printed by a real job and posted in the public report named
beside it (GitHub issues); the benign lines too (progress lines with "nan" in a field
that is not the loss, a loss scale that is still large, NCCL INFO lines, warnings).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sn_monitor.joblog.blocks import MAX_BLOCK_LINES
from sn_monitor.joblog.context import Origin
from sn_monitor.joblog.recognition import KeywordFinder, Recognizer, recognise_lines
from tests.fuzzing import examples

RECOGNIZER = Recognizer()
GH = "https://github.com/"

#: (line, category, root_candidate, source)
FAILURES = [
    ("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
     "NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.",
     "nccl-timeout", False, GH + "hiyouga/LlamaFactory/issues/7396"),
    ("[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 "
     "milliseconds before timing out.", "nccl-timeout", False, GH + "OFA-Sys/OFA/issues/271"),
    ("[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) "
     "Rank 1] Exception (either an error or timeout) detected by watchdog at work: 808, last "
     "enqueued NCCL work: 811, last completed NCCL work: 807.", "nccl-timeout", False,
     GH + "XPixelGroup/BasicSR/issues/737"),
    ("[rank1]:[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 1] Work WorkNCCL("
     "SeqNum=2521, OpType=ALLREDUCE, NumelIn=160672064, NumelOut=160672064, Timeout(ms)=600000)"
     " timed out in blocking wait.", "nccl-timeout", False,
     GH + "huggingface/diffusers/issues/12422"),
    ("[rank2]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
     "Timed out waiting 1800000ms for recv operation to complete", "nccl-timeout", False,
     GH + "meta-pytorch/torchtune/issues/2676"),
    ("[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the "
     "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
     "corrupted/incomplete data.", "nccl-timeout", False,
     GH + "tatsu-lab/stanford_alpaca/issues/207"),
    ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
     "NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5",
     "nccl-error", False, GH + "NVIDIA/nccl/issues/2076"),
    ("socketProgressOpt: Call to recv from 172.16.0.4<33759> failed : Connection reset by peer",
     "network-error", False, GH + "NVIDIA/nccl/issues/2076"),
    ("a100-st-p4d24xlarge-22:183006:183220 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv "
     "from 10.200.84.247<58355> failed : Broken pipe", "network-error", False,
     GH + "NVIDIA/nccl/issues/795"),
    ("[rank3]: NET/OFI Request 0x7f14cc5b60c0 completed with error. RC: 113. Error: 2 "
     "(UNDELIVERABLE). Completed length: 0", "network-error", True,
     GH + "NVIDIA/nccl/issues/1928"),
    ("NET/IB : Got completion from peer 11.214.147.122<39138> with error 12, opcode 0, len 0, "
     "vendor err 129", "network-error", True, GH + "tatsu-lab/stanford_alpaca/issues/207"),
    ("RuntimeError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/"
     "ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), "
     "NCCL version 2.18.1", "nccl-error", True, GH + "NVIDIA/nccl/issues/1016"),
    ("torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/"
     "distributed/c10d/ProcessGroupNCCL.cpp:3763, internal error", "nccl-error", False,
     GH + "NVIDIA/nccl/issues/1928"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
     "peer [127.0.0.1]:10895", "network-error", False,
     GH + "RVC-Project/Retrieval-based-Voice-Conversion-WebUI/issues/1882"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
     "[192.168.70.92]:25266: Connection reset by peer", "network-error", False,
     GH + "RVC-Project/Retrieval-based-Voice-Conversion-WebUI/issues/1882"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "rendezvous-error", False,
     GH + "ymcui/Chinese-LLaMA-Alpaca-2/issues/274"),
    ('    "message": "RendezvousConnectionError: The connection to the C10d store has failed. '
     'See inner exception for details.",', "rendezvous-error", False,
     GH + "pytorch/pytorch/issues/64926"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousClosedError", "rendezvous-error", False,
     GH + "pytorch/pytorch/issues/116974"),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't "
     "allocate memory: you tried to allocate 132426121216 bytes. Error code 12 (Cannot allocate "
     "memory)", "cuda-oom", True, GH + "mxfold/mxfold2/issues/20"),
    ("RuntimeError: [enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. "
     "DefaultCPUAllocator: not enough memory: you tried to allocate 26214400 bytes.",
     "cuda-oom", True, GH + "lllyasviel/Fooocus/issues/237"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total "
     "capacity of 31.47 GiB of which 12.73 GiB is free.", "cuda-oom", True,
     GH + "murong-xu/CADS/issues/4"),
    ("RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; 11.17 GiB total "
     "capacity; 10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)", "cuda-oom",
     True, GH + "shllln/GenerativeGraph/issues/5"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda-error", True,
     GH + "hpcaitech/Open-Sora/issues/694"),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda-error", True,
     GH + "Deci-AI/super-gradients/issues/1307"),
    ("../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [96,0,0], thread: "
     "[64,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && \"index out of bounds\"` "
     "failed.", "cuda-error", True, GH + "Deci-AI/super-gradients/issues/1307"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "ecc-error", True,
     GH + "jade-hpc-gpu/jade-hpc-gpu.github.io/issues/194"),
    ("[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: "
     "CUDA error: uncorrectable ECC error encountered", "ecc-error", True,
     GH + "kohya-ss/sd-scripts/issues/1434"),
    ("RuntimeError: cuda runtime error (39) : uncorrectable ECC error encountered at "
     "/pytorch/aten/src/THC/THCCachingHostAllocator.cpp:265", "ecc-error", True,
     GH + "NVIDIA/semantic-segmentation/issues/33"),
    ("[2021-11-27 00:36:54,800] [INFO] [stage2.py:1628:step] [deepscale] OVERFLOW! Rank 0 "
     "Skipping step. Attempted loss scale: 1, reducing to 1", "nan-loss", True,
     GH + "huggingface/transformers/issues/14531"),
    ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting "
     "run.", "nan-loss", True, GH + "ymcui/Chinese-LLaMA-Alpaca/issues/534"),
    ("epoch: 3451 loss: nan", "nan-loss", True, GH + "vpetren/gradnorm_tf/issues/17"),
    ("2025-04-18 21:58:31,047 - mmdet - INFO - Iter [10100/316440]\tlr: 3.990e-04, "
     "frame_0_enc_loss_cls: nan, frame_0_enc_loss_bbox: nan, loss: nan, grad_norm: nan",
     "nan-loss", True, GH + "liyih/RCTrans/issues/6"),
    ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.0002, 'epoch': 0.0}", "nan-loss", True,
     GH + "SY-Xuan/Pink/issues/6"),
    ("E0325 20:57:27.620000 2606 site-packages/torch/distributed/elastic/multiprocessing/api.py:"
     "869] failed (exitcode: -9) local_rank: 5 (pid: 2630) of binary: /root/miniconda3/bin/python",
     "process-killed", True, GH + "lmzpai/roboMamba/issues/10"),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 "
     "(pid: 1622990) of binary: /home/changquan/anaconda3/envs/lang/bin/python", "app-bug", False,
     GH + "Facico/Chinese-Vicuna/issues/113"),
    ("0: E0909 14:03:50.013000 22579342468928 torch/distributed/elastic/multiprocessing/api.py:833]"
     " failed (exitcode: -11) local_rank: 0 (pid: 2128869) of binary: python", "segfault", True,
     GH + "pytorch/pytorch/issues/135486"),
    ("0: Fatal Python error: Segmentation fault", "segfault", True,
     GH + "pytorch/pytorch/issues/135486"),
    ("subprocess.CalledProcessError: Command '['/opt/tiger/conda/bin/python3', '-u', "
     "'train_imagenet.py']' died with <Signals.SIGSEGV: 11>.", "segfault", True,
     GH + "pytorch/pytorch/issues/61839"),
    ("RuntimeError: DataLoader worker (pid 1817) is killed by signal: Killed. ",
     "dataloader-error", True, GH + "pytorch/pytorch/issues/8976"),
    ("RuntimeError: DataLoader worker (pid(s) 1224) exited unexpectedly", "dataloader-error",
     True, GH + "zylo117/Yet-Another-EfficientDet-Pytorch/issues/586"),
    ("WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 812914 closing "
     "signal SIGTERM", "process-killed", False, GH + "hpcaitech/ColossalAI/issues/3514"),
    ("CUDA kernel errors might be asynchronously reported at some other API call, so the "
     "stacktrace below might be incorrect.", "cuda-error", True, GH + "evo-design/evo/issues/136"),
    ("W0409 07:28:49.530000 1359 torch/distributed/elastic/agent/server/api.py:719] Received 15 "
     "death signal, shutting down workers", "process-killed", True,
     GH + "pytorch/pytorch/issues/147064"),
    ("RuntimeError: Application timeout caused pair closure", "nccl-timeout", False,
     "gloo, after its collective timeout (tests/fixtures/joblogs/torchrun/hang)"),
    ("[Mon Dec  7 02:10:11 2026] Out of memory: Killed process 31631 (python3) total-vm:"
     "123456kB, anon-rss:1234kB", "host-oom", True, "kernel OOM killer (mm/oom_kill.c)"),
]

#: Lines that are not failures: no finding.
BENIGN = [
    ("{'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 9.774074342405685e-06, 'epoch': 0.53}",
     GH + "AnswerDotAI/ModernBERT/issues/233"),
    ("10/30 22:19:57 - mmengine - INFO - Epoch(train) [1][240/735]  lr: 1.9813e-04  eta: 2:44:49"
     "  time: 2.8874  data_time: 0.0042  memory: 10762  loss: 2.5128  grad_norm: nan",
     GH + "InternLM/xtuner/issues/187"),
    ("[2024-09-11 17:52:18,030] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
     "Rank 0 Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648",
     GH + "zai-org/CogVideo/issues/233"),
    ("[2023-04-28 06:51:29,903] [INFO] [loss_scaler.py:188:update_scale] [deepspeed] OVERFLOW! "
     "Rank 0 Skipping step. Attempted loss scale: 65536, but hysteresis is 2. Reducing "
     "hysteresis to 1", GH + "deepspeedai/DeepSpeed/issues/931"),
    (" iteration     5426/  250000 | consumed samples:        43408 | learning rate: 2.999E-04 |"
     " global batch size:     8 | loss scale: 1.0 | grad norm: nan | number of skipped "
     "iterations:   0 | number of nan iterations:   0 |",
     GH + "bigscience-workshop/Megatron-DeepSpeed/issues/396"),
    ("gpu2:46654:46654 [0] NCCL INFO NET/IB : Using interface ib0 for sideband communication",
     GH + "NVIDIA/nccl/issues/207"),
    ("xxx-xxx-xxx-xxx:172719:172719 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), "
     "using internal implementation", GH + "NVIDIA/nccl/issues/875"),
    ("2024-04-10 04:59:03 | INFO | logs | Total loss at epoch 5, step at 58400, "
     "loss=31.05100440979004",
     GH + "RVC-Project/Retrieval-based-Voice-Conversion-WebUI/issues/1882"),
    ("[rank2]:     work.wait()               ", GH + "meta-pytorch/torchtune/issues/2676"),
    ("[rank0]:[I323 21:57:08.461980659 ProcessGroupNCCL.cpp:1538] [PG ID 0 PG GUID 0(default_pg) "
     "Rank 0] ProcessGroupNCCL heart beat monitor thread joined.", GH + "NVIDIA/nccl/issues/1657"),
    ("Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid "
     "your system being overloaded", GH + "pytorch/pytorch/issues/64926"),
]


def _one(line: str) -> list:
    return recognise_lines(RECOGNIZER, "x.log", [line], year=2026)


@pytest.mark.parametrize(("line", "category", "root", "source"), FAILURES,
                         ids=[f"{i}-{c}" for i, (_, c, _, _) in enumerate(FAILURES)])
def test_a_failure_line_from_a_public_report_gets_its_category(line: str, category: str,
                                                               root: bool, source: str) -> None:
    found = _one(line)
    assert [(f.category, f.root_candidate) for f in found] == [(category, root)], source
    assert found[0].line == 1
    assert found[0].text == line


@pytest.mark.parametrize(("line", "source"), BENIGN, ids=[str(i) for i in range(len(BENIGN))])
def test_a_benign_line_yields_no_finding(line: str, source: str) -> None:
    assert _one(line) == [], source


def test_rules_read_parameters_not_words() -> None:
    """The loss scale, the exit code, the signal and the collective's progress are read."""
    scale = "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {}, reducing to {}"
    assert _one(scale.format(65536, 32768)) == []
    assert _one(scale.format(8, 4)) == []
    assert [f.params["scale"] for f in _one(scale.format(1, 1))] == ["1"]
    signal = _one("*** Signal 15 (SIGTERM) (0x8bb63000c9049) received by PID 823809")
    assert [(f.category, f.root_candidate, f.params["signal_name"]) for f in signal] == [
        ("process-killed", False, "SIGTERM")]
    by_name = _one("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated "
                   "with signal SIGKILL")
    assert [(f.category, f.params["signal"]) for f in by_name] == [("process-killed", "9")]
    agent = "failed (exitcode: {}) local_rank: 3 (pid: 99) of binary: python"
    assert [(f.category, f.root_candidate) for f in _one(agent.format(-9))] == [
        ("process-killed", True)]
    assert [(f.category, f.root_candidate) for f in _one(agent.format(-15))] == [
        ("process-killed", False)]
    assert [(f.category, f.rank) for f in _one(agent.format(1))] == [("app-bug", 3)]
    assert _one(agent.format(0)) == []
    progress = _one("[rank3]:[E321 02:07:08.465224069 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 3] "
                    "Exception (either an error or timeout) detected by watchdog at work: 1580,"
                    " last enqueued NCCL work: 1582, last completed NCCL work: 1579.")
    assert dict(progress[0].params) == {"work": "1580", "last_enqueued": "1582",
                                        "last_completed": "1579"}
    assert progress[0].rank == 3
    megatron = "| number of skipped iterations:   0 | number of nan iterations:   {} |"
    assert _one(megatron.format(0)) == []
    assert [f.category for f in _one(megatron.format(2))] == ["nan-loss"]


TRACEBACK = [
    "step 10 loss=2.31",
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 80, in <module>',
    "    main()",
    '  File "/job/train.py", line 61, in main',
    "    batch = shard[index]",
    "           ~~~~~^^^^^^^",
    "IndexError: list index out of range",
    "step 11 loss=2.30",
]


def test_a_traceback_is_one_app_bug_at_its_exception_line_with_its_last_frame() -> None:
    [found] = recognise_lines(RECOGNIZER, "rank_2.log", TRACEBACK, year=2026)
    assert (found.line, found.category, found.root_candidate) == (8, "app-bug", True)
    assert found.text == "IndexError: list index out of range"
    assert found.params["exception"] == "IndexError"
    assert found.params["frame"] == 'File "/job/train.py", line 61, in main'


def test_a_traceback_whose_exception_a_signature_explains_adds_nothing() -> None:
    lines = ["[rank1]: Traceback (most recent call last):",
             '[rank1]:   File "/job/train.py", line 9, in step',
             "[rank1]:     x = torch.empty(10**15)",
             "[rank1]: RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator:"
             " can't allocate memory: you tried to allocate 8000000000000000 bytes. Error code 12 "
             "(Cannot allocate memory)"]
    found = recognise_lines(RECOGNIZER, "job.log", lines, year=2026)
    assert [(f.line, f.category, f.rank) for f in found] == [(4, "cuda-oom", 1)]


def test_interleaved_ranks_keep_their_tracebacks_apart() -> None:
    lines = ["[rank0]: Traceback (most recent call last):",
             "[rank1]: Traceback (most recent call last):",
             '[rank0]:   File "a.py", line 1, in f',
             '[rank1]:   File "b.py", line 2, in g',
             "[rank1]: KeyError: 'labels'",
             "[rank0]: ZeroDivisionError: division by zero"]
    found = recognise_lines(RECOGNIZER, "job.log", lines, year=2026)
    assert [(f.rank, f.params["exception"], f.params["frame"]) for f in found] == [
        (1, "KeyError", 'File "b.py", line 2, in g'),
        (0, "ZeroDivisionError", 'File "a.py", line 1, in f')]


def test_the_launchers_own_exception_is_not_an_app_bug() -> None:
    lines = ["Traceback (most recent call last):",
             '  File "/usr/bin/torchrun", line 8, in <module>',
             "    sys.exit(main())",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    assert recognise_lines(RECOGNIZER, "agent.log", lines, year=2026) == []


ROOT_CAUSE_BLOCK = [
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2025-05-21_15:43:03",
    "  host      : worker-7",
    "  rank      : 12 (local_rank: 4)",
    "  exitcode  : {code} (pid: 14750)",
    "  error_file: <N/A>",
    "  traceback : {traceback}",
    "============================================================",
]


@pytest.mark.parametrize(("code", "traceback", "category", "root"), [
    (-9, "Signal 9 (SIGKILL) received by PID 14750", "process-killed", True),
    (-11, "Signal 11 (SIGSEGV) received by PID 14750", "segfault", True),
    (1, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
     "app-bug", False),
])
def test_torchruns_root_cause_block_is_read_by_its_fields(code: int, traceback: str,
                                                          category: str, root: bool) -> None:
    lines = [line.format(code=code, traceback=traceback) for line in ROOT_CAUSE_BLOCK]
    [found] = recognise_lines(RECOGNIZER, "agent.log", lines, year=2026)
    assert (found.line, found.category, found.root_candidate) == (12, category, root)
    assert (found.rank, found.node, found.params["exitcode"]) == (12, "worker-7", str(code))
    assert found.timestamp == 1747842183.0  # 2025-05-21 15:43:03


def test_chunks_cut_anywhere_between_lines_give_the_same_findings() -> None:
    lines = [*TRACEBACK, *[line.format(code=-9, traceback="x") for line in ROOT_CAUSE_BLOCK],
             FAILURES[0][0], BENIGN[0][0]]
    whole = recognise_lines(RECOGNIZER, "f.log", lines, year=2026)
    for size in (1, 2, 5):
        stream = RECOGNIZER.stream("f.log", Origin(), year=2026)
        found = []
        for start in range(0, len(lines), size):
            found.extend(stream.feed("".join(f"{line}\n" for line in lines[start:start + size])))
        assert found == whole
        assert stream.lines == len(lines)
    assert [f.category for f in whole] == ["app-bug", "process-killed", "nccl-timeout"]


def test_a_runaway_traceback_is_given_up() -> None:
    """StopIteration: an exception only the traceback block recognises (no line signature)."""
    frames = ['  File "a.py", line 1, in f'] * (MAX_BLOCK_LINES - 2)
    short = ["Traceback (most recent call last):", *frames, "StopIteration: reached"]
    assert [f.params["exception"] for f in recognise_lines(RECOGNIZER, "f.log", short,
                                                            year=2026)] == ["StopIteration"]
    runaway = ["Traceback (most recent call last):", *frames, *frames[:3], "StopIteration: no"]
    assert recognise_lines(RECOGNIZER, "f.log", runaway, year=2026) == []


def test_the_rank_and_node_come_from_the_path_or_the_line() -> None:
    line = FAILURES[1][0]  # no rank prefix; "[Rank 1]" is a process group's rank
    [by_path] = RECOGNIZER.scan("rank_5.log", line, Origin(rank=5, node="n1"), year=2026)
    assert (by_path.rank, by_path.node) == (5, "n1")
    [by_group] = RECOGNIZER.scan("x.log", line, year=2026)
    assert by_group.rank == 1
    [by_prefix] = RECOGNIZER.scan("rank_5.log", f"[rank7]: {line}", Origin(rank=5), year=2026)
    assert by_prefix.rank == 7


def test_a_finding_keeps_the_head_and_tail_of_an_endless_line() -> None:
    line = "x" * 100_000 + " RuntimeError: CUDA error: an illegal memory access was encountered"
    [found] = _one(line)
    assert found.category == "cuda-error"
    assert len(found.text) < 5000
    assert found.text.startswith("xxxx")
    assert found.text.endswith("an illegal memory access was encountered")


#: The loss-is-nan patterns written letter-first for speed, and the (?i)\b forms they
#: replace (what they must match, exactly).
_CASELESS_FORMS = {
    1: r"(?i)\bloss (?:is|was) (?P<value>nan|inf)",
    2: r"(?i)\bloss at (?:epoch|step|iteration) \d+\s*[-:=]\s*(?P<value>nan|inf)\b",
    3: r"(?i)\boutputs? (?:is|are) nan",
}
_PIECES = ["loss", "LOSS", "Loss", "lo\u017fs", "xloss", "_loss", "is", "was", "IS", "nan",
           "NaN", "inf", "INF", "at", "epoch", "Step", "3", " : ", "=", "-", "output",
           "Outputs", "are", "aoutput", "é", "\t", ".", "/", " "]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12).map("".join))
def test_the_letter_first_nan_patterns_match_what_their_caseless_forms_match(
        line: str) -> None:
    (signature,) = [s for s in RECOGNIZER.catalogue.lines() if s.name == "loss-is-nan"]
    for index, caseless in _CASELESS_FORMS.items():
        ours, theirs = signature.patterns[index].search(line), re.search(caseless, line)
        assert (ours is None) == (theirs is None), (index, line)
        if ours is not None and theirs is not None:
            assert ours.groupdict() == theirs.groupdict(), (index, line)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.sampled_from([*sorted(RECOGNIZER.keywords)[::3], "x", " ", ":", "Err", "CUDA"]),
                min_size=1, max_size=8).map("".join))
def test_the_keyword_finder_finds_every_keyword_a_line_holds(line: str) -> None:
    """Keywords inside, overlapping and as prefixes of others included."""
    finder = KeywordFinder(RECOGNIZER.keywords)
    assert finder.find(line) == {word for word in RECOGNIZER.keywords if word in line}


# torchrun's console after rank 2 was SIGKILLed (a real run's, trimmed): its own "Root
# Cause" names rank 1, which torchrun stopped with SIGTERM after it saw rank 1 exit first;
# the "Failures:" table lists rank 2's SIGKILL, its rank on the line above the exit code.
FAILURES_TABLE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/srv/job/examples/pytorch/train.py FAILED
------------------------------------------------------------
Failures:
[0]:
  time      : 2026-12-07_11:26:50
  host      : localhost
  rank      : 2 (local_rank: 2)
  exitcode  : -9 (pid: 11034)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 11034
[1]:
  time      : 2026-12-07_11:26:50
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 11032)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 11032
------------------------------------------------------------
Root Cause (first observed failure):
[2]:
  time      : 2026-12-07_11:26:49
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 11033)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 11033
============================================================
"""


def test_a_failure_table_entry_lends_its_rank_to_its_exit_code_and_signal() -> None:
    found = RECOGNIZER.scan("torchrun.log", FAILURES_TABLE, year=2026)
    by_line = {f.line: (f.rank, f.category) for f in found}
    assert by_line[10] == (2, "process-killed")  # the SIGKILL: rank 2's entry
    assert by_line[12] == (2, "process-killed")
    assert by_line[17] == (0, "process-killed")  # the next entry's SIGTERM: rank 0
    assert by_line[26] == (1, "process-killed")  # the Root Cause block's own rank
