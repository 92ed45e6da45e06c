"""Export a CosyVoice3 model directory's speech LM as a Hugging Face Qwen2 directory (for vLLM).

    python scripts/export_llm_hf.py MODEL_DIR OUT_DIR [--dtype float32|bfloat16|float16] [--rl-llm] [--overwrite]

See ``cosyvoice/tools/export_hf.py`` for the layout (speech embedding as ``embed_tokens``, ``llm_decoder`` as
``lm_head``, vocab 6761, no tokenizer). The optional vLLM backend (``engine.llm_backend: vllm``) runs the
same export into ``MODEL_DIR/vllm`` by itself when that directory is missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from cosyvoice.checkpoint import CheckpointError  # noqa: E402
from cosyvoice.config import ConfigError  # noqa: E402
from cosyvoice.tools.export_hf import ExportError, export_qwen2_hf  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--rl-llm", action="store_true", help="export llm.rl.pt instead of llm.pt")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    args = parser.parse_args(argv)
    try:
        out = export_qwen2_hf(
            args.model_dir, args.out_dir, dtype=args.dtype, use_rl_llm=args.rl_llm, overwrite=args.overwrite
        )
    except (ExportError, ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
