from pathways_client.cli import main

main()
