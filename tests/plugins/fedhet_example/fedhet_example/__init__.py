"""An example fedhet plug-in: `skewavg`, FedAvg that down-weights label-skewed clients."""
