"""KV layouts (messages/kv_layout.py) built from configs (models/kv_layout.py): the published
Gemma shapes' groups and slots, one group for one kind of layer, the layout's validation, and
its page counts worked out by hand."""

from __future__ import annotations

import pytest

from jaxserve.messages.kv_layout import KVGroupSpec, KVLayout
from jaxserve.models.kv_layout import kv_layout, num_kv_slots
from jaxserve.models.named_shapes import named_model_config
from tests.models.gemma_shapes import F, S, gemma3


def test_gemma_3_12b_6_groups_of_8():
  layout = kv_layout(gemma3(48), page_size=16)
  assert layout.num_groups == 6 and layout.num_slots == 8 == num_kv_slots(gemma3(48))
  assert layout.groups[0] == KVGroupSpec(None, tuple(range(5, 48, 6)))
  assert layout.windows == (1024,) * 5
  assert layout.groups[1].layers == (0, 1, 2, 3, 4, 6, 7, 8)
  assert layout.groups[2].layers == (9, 10, 12, 13, 14, 15, 16, 18)  # layers 11, 17 global
  assert layout.groups[5].layers == (38, 39, 40, 42, 43, 44, 45, 46)
  assert layout.places[11] == (0, 1) and layout.places[10] == (2, 1)


def test_gemma_3_27b_7_groups_of_10_with_8_slots_padded():
  layout = kv_layout(gemma3(62), page_size=16)
  assert layout.num_groups == 7 and layout.num_slots == 10
  assert [len(g.layers) for g in layout.groups] == [10, 10, 10, 10, 10, 10, 2]
  assert 7 * 10 - layout.num_layers == 8


def test_gemma_2_alternates_in_2_groups():
  config = gemma3(42, window=4096).replace(
    architecture="gemma2",
    layer_types=tuple(S if i % 2 == 0 else F for i in range(42)),
    rope_local_base_freq=None,
    qk_norm=False,
  )
  layout = kv_layout(config, page_size=16)
  assert layout.num_groups == 2 and layout.num_slots == 21
  assert layout.groups[1] == KVGroupSpec(4096, tuple(range(0, 42, 2)))


def test_one_kind_of_layer_is_one_group_of_every_layer():
  llama = named_model_config("llama-3.1-8b")
  assert kv_layout(llama, 16) == KVLayout.single(16, 32)
  mistral = llama.replace(architecture="mistral", sliding_window=4096)  # every layer slides
  assert kv_layout(mistral, 16) == KVLayout.single(16, 32)
  assert kv_layout(mistral, 16).windows == ()


def test_pages_a_sequence_holds():
  layout = kv_layout(gemma3(48), page_size=16)
  # 8448 tokens: 528 global pages; a sliding group keeps ceil(1023 / 16) + 1 = 65
  assert layout.pages_held(8448) == 528 + 5 * 65
  assert layout.pages_held(100) == 6 * 7  # shorter than the window: every group keeps all
  # a step of up to 512 tokens allocates the window's pages before it and its own
  assert layout.max_pages(8448, 512) == 528 + 5 * (-(-(1023 + 512) // 16) + 1)
  assert KVLayout.single(16, 4).max_pages(8448, 512) == 528


@pytest.mark.parametrize(
  "groups,message",
  [
    ((), "group 0 keeps every position"),
    ((KVGroupSpec(8, (0,)),), "group 0 keeps every position"),
    ((KVGroupSpec(None, (0,)), KVGroupSpec(None, (1,))), "positive window"),
    ((KVGroupSpec(None, (0,)), KVGroupSpec(4, (1, 2))), "1 to 1 layers"),
    ((KVGroupSpec(None, (0, 1)), KVGroupSpec(4, (1,))), "exactly one group"),
    ((KVGroupSpec(None, (0, 2)),), "exactly one group"),
  ],
)
def test_layouts_that_cannot_be_served_are_refused(groups, message):
  with pytest.raises(ValueError, match=message):
    KVLayout(16, groups)
