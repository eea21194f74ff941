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


def model_without_chat_template(tmp_path: Path) -> Path:
    """SmolLM2's directory without its chat template (``chat_template.jinja`` and any
    ``tokenizer_config.json`` entry removed; the weights linked, not copied)."""
    import json
    import shutil

    from chatgym.trainer.models.packaged import load_model_path

    source, model = load_model_path("smollm2"), tmp_path / "no_template_model"
    model.mkdir()
    for path in source.iterdir():
        if path.name == "chat_template.jinja":
            continue
        if path.suffix == ".safetensors":
            (model / path.name).symlink_to(path)
        else:
            shutil.copy(path, model / path.name)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


# SmolLM2 ends assistant turns with <|im_end|> (id 2); id 5 is another token, 99999 none.
def assert_eos_refusals(
    prog: str, refuse: Callable[..., str], eos_setting: str, set_eos: Callable[[str], Sequence[str]], tmp_path: Path
) -> None:
    """``chatgym {prog}`` blames EOS ids the user gave on the setting that gave them (``set_eos(ids)``:
    the arguments that set ``eos_setting``; ``rollout.eos_token_ids`` too): an id that is no token of
    the tokenizer, and ids without the one the chat template ends assistant turns with (a template the
    model's own EOS ids pass); a template that fails with the model's EOS ids too is the template's
    fault."""
    outside = "eos_token_ids has ids outside the model's vocabulary [0, 49152): [99999] (ids the model can never sample"
    assert refuse(*set_eos("[99999]")) == f"chatgym {prog}: {eos_setting}: {outside}; [] means none)\n"
    assert refuse("rollout.eos_token_ids=[99999]") == (
        f"chatgym {prog}: rollout.eos_token_ids: {outside}; [] means the engine's)\n"
    )
    not_the_end = (
        "chat template ends assistant turns with '<|im_end|>' (id 2), which is not among these EOS ids [5]: "
        "generation would run past the end of the turn (the model's own EOS ids are [2])"
    )
    assert refuse(*set_eos("[5]")) == f"chatgym {prog}: {eos_setting}: {not_the_end}\n"
    assert refuse("rollout.eos_token_ids=[5]") == f"chatgym {prog}: rollout.eos_token_ids: {not_the_end}\n"
    template = tmp_path / "no_eos.jinja"
    template.write_text(NO_EOS_TEMPLATE)
    assert refuse(f"rollout.chat_template={template}", *set_eos("[2]")) == (
        f"chatgym {prog}: rollout.chat_template: {NO_EOS_REASON}\n"
    )


def assert_token_engine_refusals(prog: str, refuse: Callable[..., str], tmp_path: Path) -> None:
    """``chatgym {prog} --engine hf`` refuses, in one line naming the flag (``refuse(*args)``: its
    stderr): ``--chat-template model`` on a model without one, an ``--engine-arg`` the engine does not
    take (as ``chatgym train`` checks ``engine.options``) and the EOS ids of ``--engine-arg
    eos_token_ids`` (:func:`assert_eos_refusals`)."""
    model = model_without_chat_template(tmp_path)
    assert refuse("--model", str(model), "--chat-template", "model") == (
        f"chatgym {prog}: --chat-template: chat_template='model' but the model's tokenizer has no chat template\n"
    )
    assert refuse("--engine-arg", "max_batch_sise=8") == (
        f"chatgym {prog}: --engine-arg: 'max_batch_sise' not taken by the 'hf' engine (TransformersEngine); "
        "did you mean 'max_batch_size' for 'max_batch_sise'?\n"
    )
    assert_eos_refusals(
        prog, refuse, "--engine-arg eos_token_ids", lambda ids: ("--engine-arg", f"eos_token_ids={ids}"), tmp_path
    )


def assert_fp8_refusals(prog: str, refuse: Callable[..., str]) -> None:
    """``chatgym {prog} --engine hf --engine-arg quantization=fp8`` where FP8 cannot run is refused with
    that reason first, not with the decode path's hint (``decode=static``, after which came this
    refusal anyway): on a device named ``cpu`` anywhere, and on this machine when it has no CUDA."""
    import torch

    assert refuse("--engine-arg", "quantization=fp8", "--engine-arg", "device=cpu") == (
        f"chatgym {prog}: --engine-arg: quantization 'fp8' is refused: the device is 'cpu'; FP8 needs a CUDA GPU "
        "of compute capability >= 8.9\n"
    )
    if not torch.cuda.is_available():  # decode 'auto' is dynamic here: the hint came first
        assert refuse("--engine-arg", "quantization=FP8") == (
            f"chatgym {prog}: --engine-arg: quantization 'FP8' is refused: no CUDA GPU here; FP8 needs one of "
            "compute capability >= 8.9 (Ada, Hopper)\n"
        )


def assert_engine_value_refusal(prog: str, main: Callable[[Sequence[str]], int], argv: Sequence[str], capsys) -> None:
    """``chatgym {prog} ARGV --engine hf --engine-arg max_batch_size=0``: a value the engine refuses as
    it starts (the hf engine, before it loads the model) is one line naming ``--engine-arg``, status 2."""
    assert main([*argv, "--engine", "hf", "--engine-arg", "max_batch_size=0"]) == 2
    assert capsys.readouterr().err == f"chatgym {prog}: --engine-arg: max_batch_size must be an int >= 1, got 0\n"
