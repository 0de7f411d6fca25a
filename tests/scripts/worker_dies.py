"""A DataLoader whose one worker dies by SIGBUS (as on a /dev/shm too small) at its first batch."""

import os
import signal

import torch
from torch.utils.data import DataLoader, Dataset


class Dies(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGBUS)
        return torch.zeros(4)


for _batch in DataLoader(Dies(), batch_size=8, num_workers=1):
    pass
