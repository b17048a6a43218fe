"""Experiments that ship with the library, so that a plain install runs them.

`digits_convnet`, the embedded default (scikit-learn's bundled digits,
nothing downloaded), is registered by the launcher:

    tfm-ext-train --experiment=digits_convnet --mode=train_and_eval \
        --model_dir=/tmp/digits
"""
