"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): a personal model beside FedAvg's global one."""
