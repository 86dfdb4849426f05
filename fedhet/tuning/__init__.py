"""`fedhet tune`: each method's hyperparameters selected on the validation split, with equal
budgets. A group per method and setting (fedhet.tuning.groups), whose trials are ordinary runs;
an Optuna study per group chooses them and, with `prune`, stops bad ones early
(fedhet.tuning.samplers), wave by wave (fedhet.tuning.search), scored on validation alone
(fedhet.tuning.selection); a choice at the edge of what was tried is found, and a grid extended
past it (fedhet.tuning.edges), and close calls go to a runoff on more seeds
(fedhet.tuning.choice); the outcome is an artifact of the store (fedhet.tuning.outcome);
fedhet.tuning.runner computes, plans or reads a spec's tune."""
