"""Custom auth for the test proxy (``general_settings.custom_auth``): three virtual keys with aliases, so
per-key knob policies are exercised through the real proxy without a key database."""

from fastapi import HTTPException
from litellm.proxy._types import UserAPIKeyAuth

KEYS = {"sk-free-tier-0123456789": "free-tier", "sk-eco-team-0123456789": "eco-team", "sk-open-0123456789": "open"}


async def user_api_key_auth(request, api_key):  # the signature LiteLLM calls
    alias = KEYS.get(api_key)
    if alias is None:
        raise HTTPException(status_code=401, detail="unknown key")
    return UserAPIKeyAuth(api_key=api_key, key_alias=alias)
