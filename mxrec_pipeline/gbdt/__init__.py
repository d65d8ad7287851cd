"""Gradient-boosted trees beside a job's model: LightGBM's LambdaMART baseline.

`config.py` holds the `lambdamart:` config section (TensorFlow-free);
`lambdamart.py` trains and scores LightGBM's LambdaMART (an optional extra,
imported only when used). See docs/configuration.md, "lambdamart".
"""
