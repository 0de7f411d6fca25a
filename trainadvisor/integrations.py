"""The training frameworks' callbacks, where users import them:

    from trainadvisor.integrations import HuggingFaceAdvisor, LightningAdvisor

(defined in `trainadvisor.advising.integrations`).

May import: advising."""

from trainadvisor.advising.integrations import HuggingFaceAdvisor, LightningAdvisor

__all__ = ["HuggingFaceAdvisor", "LightningAdvisor"]
