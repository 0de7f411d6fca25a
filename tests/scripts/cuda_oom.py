"""Trains two steps, then dies as a GPU out of memory does: torch.OutOfMemoryError with the text
of $OOM_MESSAGE. Tests run it under the fake CUDA (tests/fakes/cuda), which answers with the
allocator's statistics and snapshot recorded at such an error on an H100. Under bf16 autocast
(the fix `amp`) it fits, as a model whose activations halve would."""

import os

import torch


class Net(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.under_autocast = torch.is_autocast_enabled("cuda")
        return super().forward(x)


model = Net(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 1 and not model.under_autocast:
        raise torch.OutOfMemoryError(os.environ["OOM_MESSAGE"])
