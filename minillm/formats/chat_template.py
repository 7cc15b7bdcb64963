"""The chat template: how a list of chat messages becomes one prompt for a model that only continues text.

The shipped model was trained on Shakespeare's plays, where a speech is the speaker's name in capitals with a
full stop, on its own line, then the lines spoken, then a blank line. So a chat is written as a play script:

    <s>[You are a helpful assistant.]            <- a system message, as a stage direction (optional)

    USER.
    Who art thou?

    ASSISTANT.
                                                 <- add_generation_prompt: the model continues as ASSISTANT

An assistant's reply is one speech, so it ends at the first blank line: CHAT_STOP is the stop string
`minillm serve` adds to every chat request (a served template cannot carry stop strings: with vLLM, pass
stop=["\\n\\n"] yourself). The template is a Jinja string as Hugging Face stores it in tokenizer_config.json
("chat_template"); `minillm.export_hf` writes it there, so transformers' `apply_chat_template` and `vllm serve`
build the same prompt, and it is rendered here with the same Jinja settings transformers uses.
"""
from __future__ import annotations

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '[' + message['content'] + ']\n\n' }}"
    "{% else %}"
    "{{ message['role'] | upper + '.\n' + message['content'] + '\n\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT.\n' }}{% endif %}"
)
CHAT_STOP = "\n\n"          # the blank line that ends a speech
ROLES = ("system", "user", "assistant")


def render_chat(messages: list, template: str = CHAT_TEMPLATE, bos_token: str = "<s>",
                add_generation_prompt: bool = True) -> str:
    """messages [{"role", "content"}] -> the prompt text (bos_token first, as the template writes it).
    Rendered as transformers renders chat templates (a sandboxed Jinja environment, trim_blocks, lstrip_blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, bos_token=bos_token,
                                            add_generation_prompt=add_generation_prompt)
