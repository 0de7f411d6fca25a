"""DataLoaders written the ways real scripts write them: a subclass, positional arguments, a
batch_sampler, batches with a list of strings beside the tensors, and a new DataLoader built
every epoch (epochs here are 12 steps). Loading is slow (sleep per sample), so the
dataloader-workers fix must be measured and applied to every loader built at that line."""

import time

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler


class Slow(Dataset):
    def __len__(self):
        return 12 * 16

    def __getitem__(self, index):
        time.sleep(0.005)  # 80 ms a batch: the workers' gain dwarfs a loaded machine's noise
        return {"x": torch.full((8,), index / 192.0), "name": f"sample-{index}"}


class MyLoader(DataLoader):
    pass


def collate(items):
    return {"x": torch.stack([i["x"] for i in items]), "names": [i["name"] for i in items]}


if __name__ == "__main__":
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Slow()
    for _epoch in range(100):
        batches = BatchSampler(SequentialSampler(data), batch_size=16, drop_last=False)
        loader = MyLoader(data, 1, None, None, batches, 0, collate)
        for batch in loader:
            loss = model(batch["x"]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
