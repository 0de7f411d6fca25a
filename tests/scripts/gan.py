"""A DCGAN-shaped loop (pytorch/examples dcgan): two trained models, each with its optimizer, a
checkpoint loaded after the models are built (`--resume`) and saved at the end (`--save`), as
the script's own `torch.save(netD.state_dict())` does. Tiny linear models: what is tested is
the compile change's place and the checkpoints' keys."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--resume", default="")
parser.add_argument("--save", default="")
args = parser.parse_args()

netG = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
netD = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
if args.resume:
    saved = torch.load(args.resume)
    netG.load_state_dict(saved["G"])
    netD.load_state_dict(saved["D"])
optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-3)
optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-3)
for _ in range(args.steps):
    fake = netG(torch.randn(16, 4))
    lossD = netD(fake.detach()).mean() - netD(torch.randn(16, 4)).mean()
    optimizerD.zero_grad()
    lossD.backward()
    optimizerD.step()
    lossG = -netD(fake).mean()
    optimizerG.zero_grad()
    lossG.backward()
    optimizerG.step()
if args.save:
    torch.save({"G": netG.state_dict(), "D": netD.state_dict()}, args.save)
print("keys", sorted(netD.state_dict()))
