"""The import paths PyTorch users type reach ember's modules."""

import importlib

import ember as em


def test_nn_functional_init_and_optim_import_as_modules():
    for name, module in (("ember.nn", em.nn), ("ember.nn.functional", em.nn.functional),
                         ("ember.init", em.init), ("ember.optim", em.optim)):
        assert importlib.import_module(name) is module
    from ember.nn import Linear, functional
    from ember.optim import AdamW

    assert functional.relu is em.nn.functional.relu and Linear is em.nn.Linear
    assert AdamW is em.optim.AdamW
