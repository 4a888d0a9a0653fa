"""How a user message becomes the prompt ids the policy reads, with the turn's image.

A text model reads the chat template of the message (`chat_prompt_ids`). A vision-language
model acting in an env that shows images (`AgentFormat.uses_images`) reads the message
with the turn's image where the format wrote `IMAGE_PLACEHOLDER`: the text before it, the
image (its vision tokens), the text after it, as transformers' processor builds one user
message from text and image content items. Acting prompts, the teacher's skill-augmented
prompts (H edits only the text) and the warm starts all go through `PromptEncoder`, so the
student and teacher rows of a turn hold the same image tokens.
"""

from __future__ import annotations

import os

import numpy as np

from seed_jax.envs.agent_format import IMAGE_PLACEHOLDER
from seed_jax.models.config import ModelConfig
from seed_jax.models.loader import resolve_model_path
from seed_jax.models.tokenizer import Tokenizer, chat_prompt_ids
from seed_jax.models.vision import ImageProcessorConfig, preprocess_images
from seed_jax.models.vision_language import ImageInputs, chat_ids_with_images


class PromptEncoder:
  """The tokenizer, and for a vision-language model its image processing.

  Args:
    tokenizer: the policy's tokenizer.
    cfg: the model's config; `processor` its image processor (both needed for images).
  """

  def __init__(self, tokenizer: Tokenizer, cfg: ModelConfig | None = None,
               processor: ImageProcessorConfig | None = None):
    self.tokenizer, self.cfg, self.processor = tokenizer, cfg, processor

  @classmethod
  def for_model(cls, tokenizer: Tokenizer, cfg: ModelConfig, name_or_path: str
                ) -> PromptEncoder:
    """The encoder of a model loaded from `name_or_path` (an embedded name or a folder);
    a vision-language model's image sizes come from its folder's
    `preprocessor_config.json`."""
    if cfg.vision is None:
      return cls(tokenizer)
    folder = resolve_model_path(name_or_path)
    if not os.path.exists(os.path.join(folder, "preprocessor_config.json")):
      raise FileNotFoundError(f"the vision-language model {cfg.model_type} needs the "
                              f"preprocessor_config.json of its folder ({folder})")
    return cls(tokenizer, cfg, ImageProcessorConfig.from_file(folder))

  @property
  def sees_images(self) -> bool:
    return self.processor is not None

  def encode_image(self, image: np.ndarray) -> ImageInputs:
    """One RGB image `[H, W, 3]` uint8 as the tower reads it (resized by the processor)."""
    if not self.sees_images:
      raise ValueError("this model has no vision tower: it cannot read an env's images")
    return ImageInputs(*preprocess_images([image], self.processor))

  def chat_ids(self, message: str, system: str | None = None,
               image: ImageInputs | None = None) -> list[int]:
    """The ids of `message` as one user turn with the generation prompt (`system` first
    when given); with `image`, the image replaces the message's one `IMAGE_PLACEHOLDER`.

    Raises:
      ValueError: an image for a message without exactly one placeholder.
    """
    if image is None:
      return chat_prompt_ids(self.tokenizer, message, system)
    if message.count(IMAGE_PLACEHOLDER) != 1:
      raise ValueError(f"a prompt with an image must hold {IMAGE_PLACEHOLDER!r} exactly once; "
                       f"it holds it {message.count(IMAGE_PLACEHOLDER)} times")
    before, after = message.split(IMAGE_PLACEHOLDER)
    parts = [part for part in (before, image, after) if not isinstance(part, str) or part]
    return chat_ids_with_images(self.tokenizer, self.cfg, parts, system)
