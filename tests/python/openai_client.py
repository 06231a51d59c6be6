"""Drives the gateway's /v1/chat/completions with the official openai package.

Usage: python openai_client.py BASE_URL TOKEN SESSION_KEY
Prints one JSON line: {"plain": ..., "streamed": ..., "chunks": N, "models": [...]}.
"""
import json
import sys

from openai import OpenAI


def main() -> None:
    base_url, token, session = sys.argv[1], sys.argv[2], sys.argv[3]
    client = OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=30)
    models = [m.id for m in client.models.list()]
    plain = client.chat.completions.create(
        model="agentloop",
        user=session,
        messages=[{"role": "user", "content": "plain hello"}],
    )
    chunks = 0
    streamed = ""
    stream = client.chat.completions.create(
        model="agentloop",
        user=session,
        stream=True,
        # The fake model's directive spaces the answer's pieces 50 ms apart, as a model
        # produces them; pieces that arrive together would go out as one chunk.
        messages=[{"role": "user", "content": "streamed hello there[[chunk_delay_ms:50]]"}],
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            streamed += chunk.choices[0].delta.content
    print(json.dumps({
        "plain": plain.choices[0].message.content,
        "streamed": streamed,
        "chunks": chunks,
        "models": models,
    }))


if __name__ == "__main__":
    main()
