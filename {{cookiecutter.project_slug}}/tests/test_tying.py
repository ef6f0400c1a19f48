"""Tied weights stay tied across the move to the device, and through training."""

import copy
import warnings

import pytest
import torch
from torch import nn

from {{ cookiecutter.package_name }}.core import find_shared_parameters, move_to_device, ops

from backend_facts import DEVICE_TYPE, PLAIN_TO_UNTIES


class WeightSharingModule(nn.Module):
    """The seeds' model: layer_3 reuses layer_1's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_1 = nn.Linear(32, 10, bias=False)
        self.layer_2 = nn.Linear(10, 32, bias=False)
        self.layer_3 = nn.Linear(32, 10, bias=False)
        self.layer_3.weight = self.layer_1.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_3(self.layer_2(self.layer_1(x)))

    def tied_pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        return [(self.layer_1.weight, self.layer_3.weight)]


class Block(nn.Module):
    def __init__(self, width: int, shared: nn.Linear | None = None) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width, bias=False)
        self.norm = nn.LayerNorm(width)
        if shared is not None:
            self.proj.weight = shared.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.tanh(self.proj(x)))


class NestedTiedModule(nn.Module):
    """A weight shared between a nested Sequential and every block of a ModuleList."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.encoder = nn.Sequential(Block(width), nn.ReLU())
        self.blocks = nn.ModuleList(Block(width, shared=self.encoder[0].proj) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder(x)
        for block in self.blocks:
            x = block(x)
        return x

    def tied_pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        first = self.encoder[0].proj.weight
        return [(first, block.proj.weight) for block in self.blocks]


class TinyLM(nn.Module):
    """A language model whose output head reuses the input embedding matrix."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(x)))

    def tied_pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        return [(self.embed.weight, self.head.weight)]


def seeds_model() -> nn.Module:
    return WeightSharingModule()


def nested_model() -> nn.Module:
    return NestedTiedModule()


def lm_model() -> nn.Module:
    return TinyLM()


MODELS = {"seeds": seeds_model, "nested": nested_model, "lm": lm_model}
INPUTS = {
    "seeds": lambda: torch.randn(4, 32),
    "nested": lambda: torch.randn(4, 8),
    "lm": lambda: torch.randint(0, 50, (4, 6)),
}


def distinct_parameters(module: nn.Module) -> int:
    return len(list(module.parameters()))


@pytest.mark.parametrize("kind", list(MODELS))
def test_move_to_device_keeps_tied_what_plain_to_may_untie(kind, device):
    """It keeps count and identity of tied parameters, where torch_xla's plain `.to()` loses
    them."""
    torch.manual_seed(0)
    model = MODELS[kind]()
    before = distinct_parameters(model)

    untied = copy.deepcopy(model).to(device)
    # The reason move_to_device re-ties (torch_xla): a plain .to() that unties.
    assert (distinct_parameters(untied) > before) is PLAIN_TO_UNTIES, "plain .to() changed"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = move_to_device(model, device)
    assert moved is model
    assert distinct_parameters(model) == before
    assert all(a is b for a, b in model.tied_pairs())
    assert all(p.device.type == DEVICE_TYPE for p in model.parameters())
    assert not [w for w in caught if "distinct parameters" in str(w.message)]


@pytest.mark.parametrize("kind", list(MODELS))
def test_optimizer_step_keeps_tied_weights_equal(kind, device):
    """It keeps tied weights equal after an SGD step on the device."""
    torch.manual_seed(0)
    model = move_to_device(MODELS[kind](), device)
    initial = [a.detach().cpu().clone() for a, _ in model.tied_pairs()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    loss = model(INPUTS[kind]().to(device)).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    ops.sync()

    for (a, b), start in zip(model.tied_pairs(), initial, strict=True):
        a_cpu, b_cpu = a.detach().cpu(), b.detach().cpu()
        assert not torch.equal(a_cpu, start), "the step did not change the tied weight"
        assert torch.equal(a_cpu, b_cpu)


def test_post_move_hook_is_called_after_the_move(device):
    """It calls `on_post_move_to_device()` once, with the weights already on the device."""

    class HookedModule(WeightSharingModule):
        def __init__(self) -> None:
            super().__init__()
            self.hook_devices: list[str] = []

        def on_post_move_to_device(self) -> None:
            self.hook_devices.append(self.layer_1.weight.device.type)

    model = move_to_device(HookedModule(), device)

    assert model.hook_devices == [DEVICE_TYPE]


def test_mismatched_parameter_count_warns_with_both_counts(device):
    """It warns with the counts before and after when a hook unties a weight."""

    class UntyingModule(WeightSharingModule):
        def on_post_move_to_device(self) -> None:
            self.layer_3.weight = nn.Parameter(self.layer_1.weight.detach().clone())

    with pytest.warns(UserWarning, match=r"had 2 distinct parameters before .* and 3 after"):
        move_to_device(UntyingModule(), device)


def test_find_shared_parameters_returns_groups_of_tied_names():
    """It groups the names of every parameter that shares one tensor."""
    assert find_shared_parameters(WeightSharingModule()) == [["layer_1.weight", "layer_3.weight"]]
    assert find_shared_parameters(NestedTiedModule()) == [
        [
            "encoder.0.proj.weight",
            "blocks.0.proj.weight",
            "blocks.1.proj.weight",
            "blocks.2.proj.weight",
        ]
    ]
    assert find_shared_parameters(TinyLM()) == [["embed.weight", "head.weight"]]
    assert find_shared_parameters(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))) == []
