"""Start-up refusals of the chatgym commands (one line, status 2, no model loaded), shared by the
tests of ``chatgym rollout``, ``eval`` and ``train``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

# Ends every turn with "\n": no EOS id after an assistant turn, so the collector's probe refuses it.
NO_EOS_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# SmolLM2's "\n" is id 198 ('Ċ'), its one EOS id 2 (<|im_end|>).
NO_EOS_REASON = (
    "chat template ends assistant turns with 'Ċ' (id 198), which is not among the EOS ids [2]: generation "
    "would run past the end of the turn (check the model's generation config / tokenizer eos_token)"
)


def refusal(main: Callable[[Sequence[str]], int], argv: Sequence[str], monkeypatch, capsys) -> str:
    """What ``main(argv)`` prints on stderr, once it returned 2 with one line and never made an engine
    (making one, i.e. loading the model, fails the test)."""
    from chatgym.trainer import engines

    def no_model(*args, **kwargs):
        raise AssertionError("the engine was made (the model loaded) before the refusal")

    monkeypatch.setattr(engines, "make_engine", no_model)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def assert_chat_template_refusals(prog: str, refuse: Callable[..., str], tmp_path: Path) -> None:
    """``chatgym {prog}`` refuses a missing ``--chat-template`` file and a template the probe refuses,
    given as ``--chat-template`` or ``rollout.chat_template`` (``refuse(*args)``: its stderr)."""
    assert refuse("--chat-template", "/nope/t.jinja") == (
        f"chatgym {prog}: --chat-template: chat_template file '/nope/t.jinja' does not exist\n"
    )
    template = tmp_path / "no_eos.jinja"
    template.write_text(NO_EOS_TEMPLATE)
    assert refuse("--chat-template", str(template)) == f"chatgym {prog}: --chat-template: {NO_EOS_REASON}\n"
    assert refuse(f"rollout.chat_template={template}") == f"chatgym {prog}: rollout.chat_template: {NO_EOS_REASON}\n"


def model_without_template(tmp_path: Path) -> Path:
    """A model directory of SmolLM2's files (linked, not copied) without its ``chat_template.jinja``:
    a model whose tokenizer has no chat template."""
    from chatgym.trainer.models.packaged import load_model_path

    source = load_model_path("smollm2")
    out = tmp_path / "no_template_model"
    out.mkdir()
    for f in source.iterdir():
        if f.name != "chat_template.jinja":
            (out / f.name).symlink_to(f)
    return out
