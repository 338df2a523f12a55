"""Params stay lazy through tracing, printing and every pass of the training pipeline;
only the first execution materializes them."""

import numpy as np

import ember as em
from ember import nn, optim
from ember.frontend.trace import TensorSpec, trace_function
from ember.ir.parser import parse
from ember.runtime.models import Mlp
from ember.runtime.pipeline import Stages, training_pipeline


def test_no_param_is_materialized_before_the_first_step():
    em.seed(0)
    model = Mlp()
    graph = trace_function(lambda x, y: nn.functional.cross_entropy(model(x), y), model,
                           [TensorSpec((8, 64)), TensorSpec((8,), "i64")], training=True)
    stages = Stages(graph, training_pipeline(optim.Adam().pass_spec()))
    for text in stages.texts.values():
        parse(text)  # every stage is printed and parses back
    assert len(stages.names) > 5
    assert not any(p.is_initialized for p in model.parameters())
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.Adam())
    assert not any(p.is_initialized for p in model.parameters())
    step(np.zeros((8, 64), np.float32), np.zeros(8, np.int64))
    assert all(p.is_initialized for p in model.parameters())
