"""Models: what a model is, from its directory to its serving versions.

    (the ModelConfig itself: pystub_backend.backend.config)
    repository  find model directories, read and complete configs, choose versions
    overrides   the parameters of a load request, the private directory of file overrides
    lifecycle   start, retire and stop versions; what is in flight
    version     one loaded version of a Python model; ensemble(_config, _run): of an ensemble
    state       the states of models and versions
    validation  checking an inference request against the config

Import what you use from the modules listed below (the package imports none of them itself).
"""

__all__ = ["config_support", "ensemble", "ensemble_config", "ensemble_run", "lifecycle", "overrides", "repository",
           "state", "validation", "version"]
