"""litellm-energy-router: energy-aware routing for LiteLLM.

Data flow: table -> profiling -> training -> router -> LiteLLM glue -> callback -> table.
Importing this package is cheap: it pulls in neither torch nor LiteLLM.
"""

__version__ = "0.1.0"
