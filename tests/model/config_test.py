"""BertConfig: the paper's size grid, one-line errors naming the field, JSON round trip."""

import pytest

from bertjax.model.config import SIZES, BertConfig
from tests.model.sizes import config_for_size

TINY = BertConfig(vocab_size=13, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=12,
                  max_position_embeddings=10, type_vocab_size=2)  # fmt: skip


def test_paper_size_grid_present():
    # Devlin et al. Table 6 (L, H, A) plus BERT-base and BERT-large; feed-forward size is 4H.
    grid = [(3, 768, 12), (6, 768, 3), (6, 768, 12), (12, 768, 12), (12, 1024, 16), (24, 1024, 16)]
    sizes = {(s["num_layers"], s["hidden_size"], s["num_heads"]): s for s in SIZES.values()}
    for lha in [*grid, (12, 768, 12), (24, 1024, 16)]:
        assert lha in sizes, lha
        assert sizes[lha]["intermediate_size"] == 4 * lha[1]
    assert config_for_size("base").num_layers == 12
    assert config_for_size("large").hidden_size == 1024


@pytest.mark.parametrize("changes,expected", [
    (dict(hidden_size=10, num_heads=4), r"BertConfig.hidden_size=10: expected a multiple of num_"),
    (dict(hidden_act="swish"), r"BertConfig.hidden_act='swish': expected one of"),
    (dict(num_layers=0), r"BertConfig.num_layers=0: expected a positive integer"),
    (dict(dtype="float8"), r"BertConfig.dtype='float8': expected one of"),
    (dict(attention="sparse"), r"BertConfig.attention='sparse': expected one of"),
    (dict(hidden_dropout_rate=1.0), r"BertConfig.hidden_dropout_rate=1.0: expected a rate"),
    (dict(remat_policy="some"), r"BertConfig.remat_policy='some': expected one of"),
    (dict(gather_last_layer="yes"), r"BertConfig.gather_last_layer='yes': expected a bool"),
])  # fmt: skip
def test_bad_config_fields_give_clear_errors(changes, expected):
    with pytest.raises(ValueError, match=expected):
        TINY.replace(**changes)


def test_config_json_round_trip_and_unknown_fields():
    assert BertConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match=r"my.json: unknown BertConfig fields \['hidden_layers'\]"):
        BertConfig.from_dict({"hidden_layers": 3}, source="my.json")
