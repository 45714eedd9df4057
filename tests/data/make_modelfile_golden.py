"""Golden Ollama Modelfiles, written by LLaMA-Factory 0.9.5 itself: its export's own steps before the
Modelfile (get_infer_args, load_tokenizer, get_template_and_fix_tokenizer) on a real tokenizer, then
the template's `get_ollama_modelfile`, the text `llamafactory-cli export` writes to `export_dir/Modelfile`.
Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_modelfile_golden.py tests/data/golden_modelfiles

Each golden is `{tokenizer}__{template}[__{variant}].Modelfile`, byte for byte LLaMA-Factory's output;
`tests/core/templates/test_ollama.py` compares tuneline's Modelfile with each.
"""
import subprocess
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[3] / "shared"

CASES = {  # file stem: (tokenizer, LLaMA-Factory arguments beyond the model)
    "llama3__llama3": ("llama3", {"template": "llama3"}),
    "qwen2.5__qwen": ("qwen2.5", {"template": "qwen"}),
    "qwen2.5__chatml": ("qwen2.5", {"template": "chatml"}),
    "qwen2.5__qwen__default_system": ("qwen2.5", {"template": "qwen", "default_system": "You answer in one word."}),
    "phi3.5__phi": ("phi3.5", {"template": "phi"}),
    "gpt2__default": ("gpt2", {"template": "default"}),
}


def llamafactory_modelfile(tokenizer_name: str, arguments: dict) -> str:
    """The Modelfile LLaMA-Factory's export writes for a model with this tokenizer and these arguments."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import get_infer_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, _, _ = get_infer_args({"model_name_or_path": str(SHARED / "tokenizers" / tokenizer_name),
                                                  **arguments})
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    return get_template_and_fix_tokenizer(tokenizer, data_args).get_ollama_modelfile(tokenizer)


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if len(sys.argv) == 3:  # one case, in a process of its own: LLaMA-Factory's templates are module state it mutates
        tokenizer_name, arguments = CASES[sys.argv[2]]
        (target / f"{sys.argv[2]}.Modelfile").write_text(llamafactory_modelfile(tokenizer_name, arguments),
                                                         encoding="utf-8", newline="")
        sys.exit(0)
    target.mkdir(parents=True, exist_ok=True)
    for stem in CASES:
        subprocess.run([sys.executable, __file__, str(target), stem], check=True, capture_output=True)
