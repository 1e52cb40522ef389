"""Layer-skip's choice of draft layers."""

from __future__ import annotations

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.layerskip import LayerSkip, parse_layer_list, skip_middle_third
from pardec_cli.methods.base import MethodEnv
from pardec_cli.engine.model import LanguageModel
from tests.tiny_models import tiny_llama


def test_default_draft_skips_the_middle_third():
    assert skip_middle_third(30) == [*range(10), *range(20, 30)]
    assert skip_middle_third(4) == [0, 3]


def test_layer_list_syntax():
    assert parse_layer_list("0-2, 5,7", 8) == [0, 1, 2, 5, 7]


@pytest.mark.parametrize("text, fragment", [("1-3", "include layer 0"), ("0,9", "has 8"), ("0-x", "is not like"), (",", "empty")])
def test_bad_layer_lists(text, fragment):
    with pytest.raises(PardecUsageError, match=fragment):
        parse_layer_list(text, 8)


def make(**knobs):
    values = dict(layers=0, layer_list="", k=4, min_k=1, max_k=12, adaptive=True) | knobs
    return LayerSkip(MethodEnv(LanguageModel(tiny_llama(layers=6)), None, None), **values)


def test_knobs_choose_the_layers():
    assert make().layers == [0, 1, 4, 5]
    assert make(layers=3).layers == [0, 1, 2]
    assert make(layer_list="0,2").layers == [0, 2]
    assert make(layers=3).knobs()["layers"] == "0-2"


@pytest.mark.parametrize("layers", [6, 7, -1])
def test_draft_must_be_shallower_than_the_model(layers):
    with pytest.raises(PardecUsageError, match="between 1 and 5"):
        make(layers=layers)
