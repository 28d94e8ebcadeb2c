from rankscope.cli import main

raise SystemExit(main())
