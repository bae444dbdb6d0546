"""Where capacity and quota are (boto3): the plan and ranking (pure) and the EC2 calls."""
