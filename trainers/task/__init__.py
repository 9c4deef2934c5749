"""What is learned: the prompt datasets, the reward functions and how a group is scored."""
