"""distlab.teach.models against the source article's own definitions (tests/article_code.py): the
same layers, the same outputs from the same weights, the same data from the same random state.
No processes are started."""
import pytest
import torch
from article_code import CELLS

from distlab.teach.models import DummyDataset, SimpleModel, ToyModel


@pytest.fixture(scope="module")
def article():
    """The article's classes, defined by running its cells that define them (no cell that runs ranks)."""
    ns: dict = {}
    exec(CELLS[0], ns)
    for cell in CELLS:
        if "class ToyModel" in cell or "class SimpleModel" in cell:
            exec(cell, ns)
    return ns


@pytest.mark.parametrize("name", ["ToyModel", "SimpleModel"])
def test_each_model_has_the_articles_layers_and_computes_what_the_article_does(article, name):
    ours, theirs = {"ToyModel": ToyModel, "SimpleModel": SimpleModel}[name](), article[name]()
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [(k, v.shape) for k, v in
                                                                     theirs.state_dict().items()]
    assert [type(m).__name__ for m in ours.modules()][1:] == [type(m).__name__ for m in theirs.modules()][1:]
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(16, 10)
    assert torch.equal(ours(x), theirs(x))


def test_the_models_shapes():
    assert ToyModel()(torch.randn(3, 10)).shape == (3, 5)
    assert SimpleModel()(torch.randn(3, 10)).shape == (3, 2)


def test_unseeded_data_is_the_articles_from_the_same_random_state(article):
    torch.manual_seed(7)
    ours = DummyDataset(size=50)
    torch.manual_seed(7)
    theirs = article["DummyDataset"](size=50)
    assert torch.equal(ours.data, theirs.data) and torch.equal(ours.targets, theirs.targets)
    assert len(DummyDataset()) == len(article["DummyDataset"]()) == 10000


def test_a_seed_gives_every_rank_the_same_data_whatever_its_random_state():
    torch.manual_seed(1)
    a = DummyDataset(size=200, seed=3)
    torch.manual_seed(2)
    b = DummyDataset(size=200, seed=3)
    assert torch.equal(a.data, b.data) and torch.equal(a.targets, b.targets)
    assert not torch.equal(DummyDataset(size=200, seed=4).data, a.data)
    assert a.data.shape == (200, 10) and sorted(a.targets.unique().tolist()) == [0, 1]


def test_an_item_is_a_row_and_its_label():
    data = DummyDataset(size=5, seed=0)
    x, y = data[3]
    assert len(data) == 5 and torch.equal(x, data.data[3]) and y == data.targets[3]
