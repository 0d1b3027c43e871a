"""What more than one test module needs: free ports, the controller harness, fake
controllers and servers, PKI, job fixtures. Test modules import from here, never from
each other, so a test file can be read, moved or deleted on its own."""
