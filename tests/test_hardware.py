"""`train.precision: auto` and `train.channels_last: auto`: decided from what the device is, recorded."""

import json

import pytest
import torch

from stages.runtime import hardware

# Flag lines as /proc/cpuinfo prints them on the CPUs this project runs on.
AVX2_EPYC = "fpu vme de pse tsc msr sse sse2 ht syscall nx avx avx2 fma bmi1 bmi2 sha_ni"
ZEN4_EPYC = AVX2_EPYC + " avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni"
SAPPHIRE_RAPIDS = AVX2_EPYC + " avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"


def _cpuinfo(tmp_path, flags):
    p = tmp_path / "cpuinfo"
    cpu = "processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: {f}\n\n"
    p.write_text(cpu.format(n=0, f=flags) + cpu.format(n=1, f=flags))
    return p


@pytest.mark.parametrize("flags, expected", [(AVX2_EPYC, None), (ZEN4_EPYC, "CPU flags avx512_bf16"),
                                             (SAPPHIRE_RAPIDS, "CPU flags amx_bf16, avx512_bf16")])
def test_bf16_units_are_read_from_the_cpu_flags(tmp_path, flags, expected):
    found = hardware.cpu_flags(_cpuinfo(tmp_path, flags))
    assert ("avx2" in found) and ("avx512_bf16" in found) == (expected is not None)
    assert hardware.bf16_units(torch.device("cpu"), found) == expected


def test_no_cpuinfo_means_no_bf16_units(tmp_path):
    assert hardware.cpu_flags(tmp_path / "absent") == set()
    assert hardware.bf16_units(torch.device("cpu"), set()) is None


def test_auto_picks_bf16_only_with_bf16_units_and_channels_last_only_from_width_20():
    cpu = torch.device("cpu")
    avx2, zen4 = set(AVX2_EPYC.split()), set(ZEN4_EPYC.split())
    assert hardware.resolve("auto", "auto", 64, cpu, avx2)[:2] == ("fp32", True)
    assert hardware.resolve("auto", "auto", 64, cpu, zen4)[:2] == ("bf16", True)
    assert hardware.resolve("auto", "auto", 8, cpu, zen4)[:2] == ("bf16", False)
    assert hardware.resolve("auto", "auto", 19, cpu, avx2)[:2] == ("fp32", False)
    assert hardware.resolve("auto", "auto", 20, cpu, avx2)[:2] == ("fp32", True)
    # What params.yaml says, when not auto, is what runs, and nothing is explained.
    assert hardware.resolve("fp32", False, 64, cpu, zen4) == ("fp32", False, "")
    assert hardware.resolve("bf16", True, 4, cpu, avx2) == ("bf16", True, "")
    why = hardware.resolve("auto", "auto", 8, cpu, zen4)[2]
    assert "avx512_bf16" in why and "width 8 < 20" in why


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_on_a_gpu_follows_its_compute_capability_where_bf16_pays_there(monkeypatch):
    dev = torch.device("cuda")
    major, _ = torch.cuda.get_device_capability(dev)
    assert hardware.resolve("auto", "auto", 64, dev)[:2] == ("fp32", False)  # no faster on an H200
    monkeypatch.setattr(hardware, "BF16_PAYS_ON", ("cpu", "cuda"))
    assert hardware.resolve("auto", "auto", 64, dev)[:2] == ("bf16" if major >= 8 else "fp32", False)


def test_bf16_units_on_a_device_where_bf16_does_not_pay_stay_fp32(monkeypatch):
    monkeypatch.setattr(hardware, "BF16_PAYS_ON", ())
    precision, _, why = hardware.resolve("auto", False, 64, torch.device("cpu"), set(ZEN4_EPYC.split()))
    assert precision == "fp32" and "not measured to pay on cpu" in why


def test_the_train_stage_records_what_auto_chose(tmp_path, monkeypatch):
    """run.json and the settings carry the resolved values and why; a run on other hardware is
    another run (its fingerprint differs), not a resume."""
    import fakedata
    from stages.pipeline import prepare, train
    from stages.runtime.config import from_dict

    fakedata.write_cifar(tmp_path / "raw", 10, 20, 4)
    monkeypatch.chdir(tmp_path)
    raw = {"data": {"download": False, "imbalance_ratio": 0.5, "root": str(tmp_path / "raw")},
           "model": {"width": 4}, "method": {"name": "sgd"},
           "train": {"epochs": 1, "device": "cpu", "precision": "auto", "channels_last": "auto"}}
    prepare.run(from_dict(raw), log=lambda *_: None)
    runs = {}
    for name, flags in (("zen4", ZEN4_EPYC), ("avx2", AVX2_EPYC)):
        monkeypatch.setattr(hardware, "cpu_flags", lambda flags=flags: set(flags.split()))
        lines = []
        train.run(from_dict(raw), log=lines.append)
        runs[name] = json.loads((tmp_path / "artifacts/train/run.json").read_text())
    assert runs["zen4"]["settings"]["precision"] == "bf16" and runs["avx2"]["settings"]["precision"] == "fp32"
    assert not runs["zen4"]["settings"]["channels_last"]
    assert "avx512_bf16" in runs["zen4"]["sources"]["hardware"]
    assert runs["zen4"]["fingerprint"] != runs["avx2"]["fingerprint"]
    assert any("starting over" in line for line in lines)
