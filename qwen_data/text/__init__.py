"""Text → token ids: the Qwen tokenizer, chats as conversations, ChatML templates, literal special tokens, loss masks."""
