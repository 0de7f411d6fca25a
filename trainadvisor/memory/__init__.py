"""What fills a step's memory: the peak split into parameters, gradients, optimizer state,
activations kept for backward and the rest, measured on one step of the window (`step`).

May import: records, errors."""
