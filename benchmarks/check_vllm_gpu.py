"""Check the single-GPU vLLM offline profiling mode on a machine that has a GPU and vLLM.

    python benchmarks/check_vllm_gpu.py [--model HF_ID_OR_PATH ...] [--meter nvml]

Without an NVIDIA GPU or without vLLM (``pip install 'litellm-energy-router[gpu]'``) it prints why it
cannot check and exits 0 — the CPU test suite does not need it. With both, it profiles the given
models (default: a tiny random-weight Qwen2 model built locally, offline, with a BPE tokenizer
trained on the test task files — it answers nonsense, but it exercises load, batched generation,
the NVML counter, token attribution, grading and unload) over the committed test task files into
a temporary SQLite table, and checks that every (query, model) row was written with energy > 0 J.
Last line: ``vllm_offline_rows=<n> mean_j=<x> ok=<true|false>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "data" / "tasks"


def why_not() -> str | None:
    """None when a GPU and vLLM are present, else the reason."""
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        return "no NVIDIA driver on this machine"
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
    except ImportError:
        return "torch is not installed"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed (pip install 'litellm-energy-router[gpu]')"
    return None


def tiny_model(out: Path) -> Path:
    """A 2-layer random Qwen2 model + BPE tokenizer trained on the test task texts (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    texts = [line for f in TASKS.glob("*.jsonl") for line in f.read_text().splitlines()]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1024, special_tokens=specials))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(out)
    cfg = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="HF id or local path (repeatable); default: a tiny local model")
    ap.add_argument("--meter", default="nvml", help="energy meter name (default nvml)")
    args = ap.parse_args()
    reason = why_not()
    if reason:
        print(f"vLLM GPU check skipped: {reason}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from litellm_energy_router.profiling.config import parse_tournament_config
    from litellm_energy_router.profiling.vllm_offline import run_offline

    from litellm_energy_router.table import open_store

    with tempfile.TemporaryDirectory() as tmp:
        models = args.model or [str(tiny_model(Path(tmp) / "tiny-qwen2"))]
        profile = Path(tmp) / "profile.yaml"  # only used if the meter is 'estimate'
        profile.write_text(
            json.dumps(
                {
                    "models": {
                        f"m{i}": {"j_per_output_token": 0.1, "j_per_prompt_token": 0.01} for i in range(len(models))
                    }
                }
            )
        )
        tasks = ["mmlu", "arc_challenge", "hellaswag", "winogrande", "gsm8k", "mbpp"]
        cfg = parse_tournament_config(
            {
                "mode": "vllm_offline",
                "candidates": [{"model_name": f"m{i}", "model": m} for i, m in enumerate(models)],
                "tasks": [{"name": t, "source": str(TASKS / f"{t}.jsonl"), "max_tokens": 32} for t in tasks],
                "energy": {"meter": args.meter, "profile": str(profile)},
                "vllm": {"gpu_memory_utilization": 0.3, "enforce_eager": True, "max_model_len": 2048},
                "batch_size": 16,
            }
        )
        url = f"sqlite:///{Path(tmp) / 'vllm.db'}"
        summary = run_offline(cfg, url)
        with open_store(url) as store:
            rows = list(store.iter_runs())
    want = len(models) * 8 * len(tasks)
    energies = [r["energy_j"] for r in rows if r["energy_j"] is not None]
    mean_j = sum(energies) / len(energies) if energies else 0.0
    ok = summary.complete and len(rows) == want and len(energies) == want and mean_j > 0
    for s in summary.candidates.values():
        print(f"{s.candidate}: {s.done} pairs, accuracy {s.accuracy}, mean J {s.mean_energy_j}")
    print(f"vllm_offline_rows={len(rows)} mean_j={mean_j:.4f} ok={'true' if ok else 'false'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
