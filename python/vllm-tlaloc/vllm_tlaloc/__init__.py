"""vLLM platform plugin for Tlaloc artifacts.

vLLM finds :func:`register` through the ``vllm.platform_plugins`` entry point and imports the
platform class it names only when the plugin is selected. Nothing of vLLM (or torch) is imported
here, and no device client is created: the engine process creates it when the worker loads.
"""


def register():
    """Names the platform class; vLLM imports it lazily."""
    return "vllm_tlaloc.platform.TlalocPlatform"
