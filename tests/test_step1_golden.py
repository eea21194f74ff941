"""Behaviour pin for the trainer's layout: step 1 of the main job (and of two tiny cases covering
the reference policy, old logprobs and LoRA) trains on the same batch — token ids, loss mask,
advantages — and ends at the same weights as the recorded golden, so a change of layout that
changes behaviour fails here.

The golden values in ``tests/data/step1_golden.json`` are recorded with
``tests/step1_golden.py --write`` (see its docstring for what is stored and the tolerances).
"""

from __future__ import annotations

import json

import pytest
from step1_golden import CASES, GOLDEN, compare, run_case


@pytest.mark.parametrize("case", CASES)
def test_step1_batch_and_weights_match_the_golden(case, tmp_path):
    from chatgym.trainer.models.packaged import load_model_path

    try:
        load_model_path("smollm2")  # the tiny cases read its config and tokenizer too
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    if case == "math_grpo":
        pytest.importorskip("reasoning_gym")
    want = json.loads(GOLDEN.read_text())[case]
    got = run_case(case, tmp_path)
    # Exact: token ids and loss mask of every row; advantages to 2e-6; the weight change per
    # parameter (its norm and a fixed random projection) to a relative 1e-4 (3e-3 for the projection:
    # see PROJECTION_RTOL).
    assert compare(case, got, want) == []
    assert got["token_ids_sha"] == want["token_ids_sha"]
    assert got["trained_tokens"] == want["trained_tokens"]
