"""dfl: a decentralized gossip simulator for decentralized federated learning."""

__version__ = "0.1.0"
